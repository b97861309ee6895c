"""OpenVINO Model Server: POST /chat/completions with its own sampling parameters
(top_k, repetition_penalty, best_of, length_penalty, ignore_eos, speculative and prompt
lookup decoding); errors as `{"error": message}`. Its rules between fields are in ovms.yaml
(`x-chatgate-rules`); its images (base64, http(s), a local path under the allowed directory) are
screened by gateway/policy/media.py before any backend."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.core.canonical import ChatRequest, Completion, Usage
from gateway.core.errors import GatewayError
from gateway.dialects.dialect import Dialect
from gateway.dialects.shape import OpenAIShaped, Shared, StreamState
from gateway.dialects.translator import Answer

if TYPE_CHECKING:
    from generated import ovms as ovms_doc

INCLUDE_STOP = "include_stop_str_in_output"


class OVMSTranslator(
    OpenAIShaped[
        "ovms_doc.CreateChatCompletionRequest",
        "ovms_doc.CreateChatCompletionResponse",
        "ovms_doc.CreateChatCompletionStreamResponse",
        "ovms_doc.ChatCompletionStreamChoice",
        "ovms_doc.ErrorResponse",
    ]
):
    """OVMS sends no `id` (the seed lists it as unsupported) and no `system_fingerprint`."""

    # OVMS documents only `stop` and `length`.
    finish_reasons = {
        "stop": "stop",
        "stop_sequence": "stop",
        "length": "length",
        "tool_calls": "stop",
        "content_filter": "stop",
    }
    missing_logprob = None  # ovms.yaml: null when the runtime has none

    def read(self, body: ovms_doc.CreateChatCompletionRequest) -> ChatRequest:
        request = super().read(body)
        # The seed: a streamed answer keeps a matched stop string unless told otherwise. Said
        # to every backend as the option, where there is a stop string for it to matter.
        if request.stream and request.stop and INCLUDE_STOP not in request.options:
            request.options[INCLUDE_STOP] = True
        return request

    def completion(self, answer: Answer, completion: Completion) -> ovms_doc.CreateChatCompletionResponse:
        request = answer.request
        return {
            "object": "chat.completion",
            "created": answer.created,
            "model": answer.model,
            "choices": [
                {
                    "index": c.index,
                    "message": self.message_body(c, request),
                    "logprobs": self.logprobs_body(c.logprobs, c.refusal_logprobs),
                    "finish_reason": self.finish_word(c.finish_reason, request),
                }
                for c in completion.choices
            ],
            "usage": self.usage_body(completion.usage),
        }

    def chunk_body(
        self,
        answer: Answer,
        state: StreamState[ovms_doc.CreateChatCompletionStreamResponse],
        choices: list[ovms_doc.ChatCompletionStreamChoice],
        usage: Usage | None = None,
        last_of_choice: bool = False,
    ) -> ovms_doc.CreateChatCompletionStreamResponse:
        chunk: ovms_doc.CreateChatCompletionStreamResponse = {
            "object": "chat.completion.chunk",
            "created": answer.created,
            "model": answer.model,
            "choices": choices,
        }
        if usage is not None:
            chunk["usage"] = self.usage_body(usage)
        elif answer.request.include_usage:  # null in every chunk before the usage chunk
            chunk["usage"] = None
        return chunk

    def chunk_choice(
        self, index: int, delta: Shared, logprobs: Shared = None, finish_reason: Shared = None
    ) -> ovms_doc.ChatCompletionStreamChoice:
        return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}

    def error_body(self, error: GatewayError, request_id: str) -> ovms_doc.ErrorResponse:
        return {"error": error.message}


DIALECT = Dialect(
    name="ovms",
    document="ovms.yaml",
    translator=OVMSTranslator,
    chat_operations=("createChatCompletion",),
    screens_media=True,
    probes="ovms",
)
