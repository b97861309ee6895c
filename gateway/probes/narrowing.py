"""Findings → a deployment's capabilities, less what its upstream does not honour: a feature
found `ignored` or `refused` makes its parameters unsupported, so a request for it gets the
policy's 422 naming the parameter (gateway/policy/capabilities.py), not a silent 200.

Only features a request can ask for narrow anything: max_tokens, the stream's [DONE] and usage,
the error shape and auth are the gateway's own business once it sits in front."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from backends.base import Capabilities, refused
from gateway.probes.findings import NOT_HONOURED, Finding

PARAMETERS_OF: dict[str, tuple[str, ...]] = {
    "n": ("n",),
    "logprobs": ("logprobs", "top_logprobs"),
    "tools": ("tools", "tool_choice", "parallel_tool_calls"),
    "stop": ("stop",),
    "seed": ("seed",),
}
RESPONSE_FORMAT_OF: dict[str, str] = {"json_object": "json_object", "json_schema": "json_schema"}
NARROWING = frozenset(PARAMETERS_OF) | frozenset(RESPONSE_FORMAT_OF)


def not_honoured(findings: Iterable[Finding]) -> set[str]:
    """The features found ignored or refused that a request can ask for (those that narrow)."""
    return {f.feature for f in findings if f.verdict in NOT_HONOURED and f.feature in NARROWING}


def narrowed(declared: Capabilities, features: set[str]) -> Capabilities:
    """`declared` without the parameters and response formats of `features`."""
    parameters = dict(declared.parameters)
    for feature in sorted(features):
        for name in PARAMETERS_OF.get(feature, ()):
            parameters[name] = refused(f"probing found the upstream does not honour {feature}")
    formats = declared.response_formats - {RESPONSE_FORMAT_OF[f] for f in features if f in RESPONSE_FORMAT_OF}
    return replace(
        declared,
        parameters=parameters,
        response_formats=formats,
        max_n=1 if "n" in features else declared.max_n,
        max_top_logprobs=0 if "logprobs" in features else declared.max_top_logprobs,
    )


def refused_requests(features: set[str]) -> list[str]:
    """What a request is refused for once `features` narrow a deployment (for /ready)."""
    names = [name for feature in sorted(features) for name in PARAMETERS_OF.get(feature, ())]
    formats = [
        f"response_format {RESPONSE_FORMAT_OF[f]}" for f in sorted(features) if f in RESPONSE_FORMAT_OF
    ]
    return names + formats
