"""Aleph Alpha's probes: `POST /chat/completions`, one user message (its strict order holds).
Its document rejects `tools`, `tool_choice` and `response_format` (a 400) and accepts `seed`
only to ignore it, so those are not probed; errors are `{"error": ..., "code": "UPPER_SNAKE"}`."""

from __future__ import annotations

from typing import Any

from gateway.probes import judges as j
from gateway.probes.probe_set import Listing, ProbeSet, first_of


def aleph_alpha_error(body: Any) -> bool:
    if not isinstance(body, dict):
        return False
    return isinstance(body.get("error"), str) and isinstance(body.get("code"), str)


ALEPH_ALPHA = ProbeSet(
    dialect="aleph_alpha",
    path="/chat/completions",
    plain=j.plain(),
    probes=(
        j.n_probe(),
        j.logprobs_probe(),
        j.stop_probe(),
        j.max_tokens_probe(),
        j.stream_done_probe(),
        j.stream_usage_probe(stream_options={"include_usage": True}),
        j.error_shape_probe(aleph_alpha_error, "{'error': ..., 'code': ...}"),
        j.auth_probe(),
    ),
    error_message=j.refusal_words,
    listing=Listing("listModelsAvailable", lambda body: first_of(body, "", "name")),
    absent={
        "tools": "the aleph_alpha dialect rejects tools (400)",
        "json_object": "the aleph_alpha dialect rejects response_format (400)",
        "json_schema": "the aleph_alpha dialect rejects response_format (400)",
        "seed": "the aleph_alpha dialect accepts seed and ignores it",
    },
)
