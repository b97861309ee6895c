"""Azure AI Model Inference's probes: `POST /chat/completions?api-version=…` (the version is
required). Its document has no `n` and no logprobs; a stream ends with `[DONE]` and carries the
usage in its last chunk unasked (there is no stream_options); errors are the seed's flat bodies,
`{"error": "Bad request", "message": ..., "status": 400}`, or Azure.Core's
`{"error": {"code": ..., "message": ...}}`, which the azure-ai-inference SDK reads (chatgate
sends the seed's fields with `error` as that object)."""

from __future__ import annotations

from typing import Any

from gateway.probes import judges as j
from gateway.probes.probe_set import Listing, ProbeSet

API_VERSION = "2024-05-01-preview"  # the SDK's (the seed's example sends 2024-04-01-preview)


def azure_error(body: Any) -> bool:
    if not isinstance(body, dict):
        return False
    error = body.get("error")
    if isinstance(error, dict):  # Azure.Core's error object
        return isinstance(error.get("code"), str) and isinstance(error.get("message"), str)
    return isinstance(error, str) and isinstance(body.get("message"), str) and "status" in body


def model_name(body: Any) -> Any:
    """The model `/info` describes."""
    return body.get("model_name") if isinstance(body, dict) else None


AZURE = ProbeSet(
    dialect="azure",
    path=f"/chat/completions?api-version={API_VERSION}",
    plain=j.plain(),
    probes=(
        j.tools_probe(),
        j.json_object_probe(),
        j.json_schema_probe(),
        j.stop_probe(),
        j.seed_probe(),
        j.max_tokens_probe(),
        j.stream_done_probe(),
        j.stream_usage_probe(),
        j.error_shape_probe(azure_error, "{'error': {'code', 'message'}} or {'error', 'message', 'status'}"),
        j.auth_probe(),
    ),
    error_message=j.refusal_words,
    listing=Listing("getModelInfo", model_name, {"api-version": API_VERSION}),
    absent={
        "n": "the azure dialect has no n (one choice)",
        "logprobs": "the azure dialect has no logprobs",
    },
)
