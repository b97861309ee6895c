"""OpenVINO Model Server: POST /chat/completions with its own sampling parameters
(top_k, repetition_penalty, best_of, length_penalty, ignore_eos, speculative and prompt
lookup decoding); errors as `{"error": message}`. Its rules between fields are in ovms.yaml
(`x-chatgate-rules`); its images (base64, http(s), a local path under the allowed directory) are
screened by gateway/policy/media.py before any backend."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gateway.core.canonical import ChatRequest
from gateway.core.errors import GatewayError
from gateway.dialects.dialect import Dialect
from gateway.dialects.shape import OpenAIShaped

if TYPE_CHECKING:
    from generated import ovms as ovms_doc

INCLUDE_STOP = "include_stop_str_in_output"


class OVMSTranslator(OpenAIShaped):
    # OVMS documents only `stop` and `length`.
    finish_reasons = {
        "stop": "stop",
        "stop_sequence": "stop",
        "length": "length",
        "tool_calls": "stop",
        "content_filter": "stop",
    }
    id_in_bodies = False  # OVMS sends no `id` (the seed lists it as unsupported)
    missing_logprob = None  # ovms.yaml: null when the runtime has none
    usage_in_chunks = "null_when_asked"

    def read(self, body: dict[str, Any]) -> ChatRequest:
        request = super().read(body)
        # The seed: a streamed answer keeps a matched stop string unless told otherwise. Said
        # to every backend as the option, where there is a stop string for it to matter.
        if request.stream and request.stop and INCLUDE_STOP not in request.options:
            request.options[INCLUDE_STOP] = True
        return request

    def error_body(self, error: GatewayError, request_id: str) -> ovms_doc.ErrorResponse:
        return {"error": error.message}


DIALECT = Dialect(
    name="ovms",
    document="ovms.yaml",
    default_mount="/v3",
    translator=OVMSTranslator,
    chat_operations=("createChatCompletion",),
    screens_media=True,
)
