"""OpenVINO Model Server's probes: `POST /chat/completions` (chatgate's /v3). `n` above 1
needs `best_of` at least as large; logprobs are the chosen token's only (no top_logprobs, which
the document rejects, as it rejects response_format); errors are `{"error": ...}`. Its document
lists no models, and a request must name one: the probes need it given (--model)."""

from __future__ import annotations

from typing import Any

from gateway.probes import judges as j
from gateway.probes.probe_set import Probe, ProbeSet


def ovms_error(body: Any) -> bool:
    return isinstance(body, dict) and isinstance(body.get("error"), str)


OVMS = ProbeSet(
    dialect="ovms",
    path="/chat/completions",
    plain=j.plain(),
    probes=(
        j.n_probe(best_of=2),
        Probe("logprobs", (j.plain(logprobs=True),), j.judge_token_logprobs),
        j.tools_probe(),
        j.stop_probe(),
        j.seed_probe(),
        j.max_tokens_probe(),
        j.stream_done_probe(),
        j.stream_usage_probe(stream_options={"include_usage": True}),
        j.error_shape_probe(ovms_error, "{'error': ...}"),
        j.auth_probe(),
    ),
    error_message=j.refusal_words,
    absent={
        "json_object": "the ovms dialect rejects response_format",
        "json_schema": "the ovms dialect rejects response_format",
    },
)
