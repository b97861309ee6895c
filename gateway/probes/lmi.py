"""DJL LMI's probes: `POST /v1/chat/completions` (the base URL is the container's root, or
chatgate's /lmi). No tools, no response_format; logprobs only with a positive top_logprobs; a
stream is `application/jsonlines` with no end marker (its last line carries the finish reason)
and no usage; errors are DJL Serving's `{"code": 400, "type": ..., "message": ...}`. Its
document lists no models (a container serves one), and a request need not name one."""

from __future__ import annotations

from typing import Any

from gateway.probes import judges as j
from gateway.probes.probe_set import Probe, ProbeSet


def lmi_error(body: Any) -> bool:
    if not isinstance(body, dict):
        return False
    return isinstance(body.get("code"), int) and isinstance(body.get("message"), str) and "type" in body


LMI = ProbeSet(
    dialect="lmi",
    path="/v1/chat/completions",
    plain=j.plain(),
    probes=(
        j.n_probe(),
        j.logprobs_probe(),
        j.stop_probe(),
        j.seed_probe(),
        j.max_tokens_probe(),
        Probe("stream_done", (j.plain(stream=True),), j.judge_json_lines_end),
        j.error_shape_probe(lmi_error, "{'code': ..., 'type': ..., 'message': ...}"),
        j.auth_probe(),
    ),
    error_message=j.refusal_words,
    absent={
        "tools": "the lmi dialect has no tools",
        "json_object": "the lmi dialect has no response_format",
        "json_schema": "the lmi dialect has no response_format",
        "stream_usage": "the lmi dialect's stream has no usage",
    },
)
