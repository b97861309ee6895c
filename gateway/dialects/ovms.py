"""OpenVINO Model Server: POST /chat/completions with its own sampling parameters
(top_k, repetition_penalty, best_of, length_penalty, ignore_eos, speculative and prompt
lookup decoding); errors as `{"error": message}`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.core.canonical import ChatRequest
from gateway.core.errors import BadRequest, GatewayError
from gateway.dialects.dialect import Dialect
from gateway.dialects.shape import OpenAIShaped

if TYPE_CHECKING:
    from generated import ovms as ovms_doc


class OVMSTranslator(OpenAIShaped):
    # OVMS documents only `stop` and `length`.
    finish_reasons = {
        "stop": "stop",
        "stop_sequence": "stop",
        "length": "length",
        "tool_calls": "stop",
        "content_filter": "stop",
    }

    def check(self, request: ChatRequest) -> None:
        options = request.options
        if request.stream and options.get("include_stop_str_in_output") is False:
            raise BadRequest(
                "include_stop_str_in_output cannot be false when stream is true.",
                param="include_stop_str_in_output",
                loc=["body", "include_stop_str_in_output"],
                value=False,
            )
        best_of = options.get("best_of")
        if best_of is not None and best_of < request.n:
            raise BadRequest(
                f"best_of ({best_of}) must be greater than or equal to n ({request.n}).",
                param="best_of",
                loc=["body", "best_of"],
                value=best_of,
            )

    def error_body(self, error: GatewayError, request_id: str) -> ovms_doc.ErrorResponse:
        return {"error": error.message}


DIALECT = Dialect(
    name="ovms",
    document="ovms.yaml",
    default_mount="/v3",
    translator=OVMSTranslator,
    chat_operations=("createChatCompletion",),
)
