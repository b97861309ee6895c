"""The Backend interface: declared capabilities plus an async generator of canonical events."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway.core.canonical import ChatRequest, EventStream


@dataclass(frozen=True, slots=True)
class Param:
    """How a backend takes one canonical parameter: its own name for it and the range it accepts.

    `target=None` means the backend cannot honour it: a request that sets it gets a 422.
    """

    target: str | None
    minimum: float | None = None
    maximum: float | None = None
    note: str = ""

    @property
    def supported(self) -> bool:
        return self.target is not None


def same_names(*names: str) -> dict[str, Param]:
    """A parameter table for a backend that takes these canonical parameters under the same names."""
    return {name: Param(name) for name in names}


def unsupported(note: str, *names: str) -> dict[str, Param]:
    """Table entries for parameters a backend cannot honour (a request setting one gets 422)."""
    return {name: Param(None, note=note) for name in names}


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a backend (and the model behind it) can do; the policy layer reads this table.

    `parameters` maps canonical parameter names (ChatRequest fields, and the dialect options
    such as top_k) to how the backend takes them; a name missing from it is unsupported.
    """

    modalities: frozenset[str] = frozenset({"text"})
    parameters: Mapping[str, Param] = field(default_factory=dict)
    response_formats: frozenset[str] = frozenset({"text"})
    max_n: int = 1
    max_top_logprobs: int = 0
    context_length: int = 8192
    # The most tokens one choice may hold (a request asking for more gets 422), and what a
    # request that names no limit gets; None: the backend decides.
    max_output_tokens: int | None = None
    default_max_tokens: int | None = None


class Backend(Protocol):
    name: str
    capabilities: Capabilities

    def generate(self, request: ChatRequest) -> EventStream:
        """Yield TextDelta / ToolCallDelta / Finish events, then one Usage event."""
        ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True, slots=True)
class BackendKind:
    """One kind of backend, as the config names it: where its class and its options model live
    (imported only when used, so optional extras stay optional) and what it needs installed."""

    name: str
    backend: str  # "module:Class"
    options: str  # "module:OptionsModel", validated at start before anything is built
    requires: tuple[str, ...] = ()  # modules that must be importable
    install: str = ""  # how to get them

    def load(self, where: str) -> Any:
        module_name, _, attribute = where.partition(":")
        return getattr(importlib.import_module(module_name), attribute)

    def missing(self) -> list[str]:
        """The required modules that cannot be imported here."""
        return [name for name in self.requires if importlib.util.find_spec(name) is None]


BACKEND_KINDS: dict[str, BackendKind] = {
    kind.name: kind
    for kind in (
        BackendKind("echo", "backends.echo:EchoBackend", "backends.echo:EchoOptions"),
        BackendKind("tgi", "backends.tgi:TGIBackend", "backends.tgi:TGIOptions"),
        BackendKind(
            "openai-compatible",
            "backends.openai_compatible:OpenAICompatibleBackend",
            "backends.openai_compatible:Options",
        ),
        BackendKind(
            "local",
            "backends.local:LocalBackend",
            "backends.local:LocalOptions",
            requires=("torch", "transformers"),
            install="pip install 'chatgate[local]' plus PyTorch (README, 'local backend')",
        ),
    )
}


def create_backend(kind: str, model: str, options: dict[str, Any]) -> Backend:
    """Instantiate a backend by its kind name."""
    backend_kind = BACKEND_KINDS[kind]
    return backend_kind.load(backend_kind.backend)(model=model, **options)
