"""A deployment's capabilities: the backend's own table, as the deployment's config narrows it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from backends.base import Capabilities
from gateway.config.settings import DeploymentCapabilities


def narrower(declared: int | None, configured: int | None) -> int | None:
    """The tighter of two optional limits."""
    if declared is None or configured is None:
        return configured if declared is None else declared
    return min(declared, configured)


def tighter(declared: float | None, configured: float | None, pick: Callable[..., float]) -> float | None:
    """The tighter of two optional bounds (`pick`: max for lower bounds, min for upper ones)."""
    if declared is None or configured is None:
        return configured if declared is None else declared
    return pick(declared, configured)


def effective(backend: Capabilities, narrowed: DeploymentCapabilities) -> Capabilities:
    """The backend's capabilities as the deployment's config narrows them."""
    parameters = {k: v for k, v in backend.parameters.items() if k not in narrowed.unsupported_parameters}
    for name, bounds in narrowed.parameter_ranges.items():
        if (param := parameters.get(name)) is not None and param.supported:
            minimum = tighter(param.minimum, bounds.minimum, max)
            maximum = tighter(param.maximum, bounds.maximum, min)
            parameters[name] = replace(param, minimum=minimum, maximum=maximum)
    modalities = backend.modalities
    max_output = narrower(backend.max_output_tokens, narrowed.max_output_tokens)
    if narrowed.modalities is not None:
        modalities = modalities & frozenset(narrowed.modalities)
    return replace(
        backend,
        parameters=parameters,
        modalities=modalities,
        max_n=min(backend.max_n, narrowed.max_n or backend.max_n),
        context_length=narrower(backend.context_length, narrowed.context_length),
        max_output_tokens=max_output,
        default_max_tokens=narrower(
            narrower(backend.default_max_tokens, narrowed.default_max_tokens), max_output
        ),
    )
