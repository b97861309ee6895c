"""The OpenAI dialect's probes: what upstreams speak, so also what a deployment probes. Every
feature of the common list is OpenAI's; its errors are `{"error": {"message": ...}}`."""

from __future__ import annotations

from typing import Any

from gateway.probes import judges as j
from gateway.probes.probe_set import Listing, ProbeSet, first_of


def openai_error(body: Any) -> bool:
    error = body.get("error") if isinstance(body, dict) else None
    return isinstance(error, dict) and isinstance(error.get("message"), str)


OPENAI = ProbeSet(
    dialect="openai",
    path="/chat/completions",
    plain=j.plain(),
    probes=(
        j.n_probe(),
        j.logprobs_probe(),
        j.tools_probe(),
        j.json_object_probe(),
        j.json_schema_probe(),
        j.stop_probe(),
        j.seed_probe(),
        j.max_tokens_probe(),
        j.stream_done_probe(),
        j.stream_usage_probe(stream_options={"include_usage": True}),
        j.error_shape_probe(openai_error, "{'error': {'message': ...}}"),
        j.auth_probe(),
    ),
    error_message=j.refusal_words,
    listing=Listing("listModels", lambda body: first_of(body, "data", "id")),
)
