"""DJL LMI / SageMaker: POST /v1/chat/completions and /invocations (chat when the body has
`messages`), GET /ping. Streams are JSON lines, the finish reason on the last token's line (when
the backend marks it);
finish reasons `length`, `eos_token`, `stop_sequence`; `usage` always in the completion, never in
a stream; logprobs only with a positive `top_logprobs`; errors as DJL Serving's
`{code, type, message}`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson
from starlette.responses import Response

from gateway.core.canonical import ChatRequest, Completion, Event, Finish, TextDelta, TokenBytes, Usage
from gateway.core.errors import GatewayError
from gateway.dialects.dialect import Dialect, Handler, ModelDirectory, OperationCall
from gateway.dialects.framing import JSONLines
from gateway.dialects.shape import OpenAIShaped, Shared, StreamState
from gateway.dialects.translator import JSON, Answer, Translator

if TYPE_CHECKING:
    from generated import lmi as lmi_doc

EXCEPTION_NAMES = {
    400: "BadRequestException",
    401: "UnauthorizedException",
    403: "ForbiddenException",
    404: "ModelNotFoundException",
    405: "BadRequestException",
    408: "BadRequestException",
    413: "PayloadTooLargeException",
    415: "BadRequestException",
    422: "BadRequestException",
    429: "ServiceUnavailableException",
    431: "BadRequestException",
    500: "InternalServerException",
    502: "BadGatewayException",
    503: "ServiceUnavailableException",
    504: "TimeoutException",
}


class LMITranslator(
    OpenAIShaped[
        "lmi_doc.ChatCompletionRequest",
        "lmi_doc.ChatCompletion",
        "lmi_doc.ChatCompletionChunk",
        "lmi_doc.StreamChoice",
        "lmi_doc.ErrorResponse",
    ]
):
    """No `model` in LMI's bodies; a chunk's logprobs a one-element list (see lmi.yaml)."""

    framing = JSONLines()
    text_templated = False  # a text marked `last` waits for its finish (`chunks`)
    finish_delta = {"content": ""}
    separate_role_chunk = False  # LMI's first chunk carries the role and the first token
    usage_chunk = "never"  # LMI's stream has no usage
    finish_reasons = {
        "stop": "eos_token",
        "stop_sequence": "stop_sequence",
        "length": "length",
        "tool_calls": "eos_token",
        "content_filter": "stop_sequence",
    }

    def read(self, body: lmi_doc.ChatCompletionRequest) -> ChatRequest:
        request = super().read(body)
        # LMI returns logprobs only "when logprobs=true and top_logprobs is a positive integer"
        if request.logprobs and not request.top_logprobs:
            request.logprobs = False
        return request

    @staticmethod
    def token_bytes(token: str) -> list[int] | None:
        # LMI builds `bytes` as Unicode code points, and null for an empty token.
        return [ord(c) for c in token] or None

    def entry_bytes(self, token: str, given: TokenBytes) -> list[int] | None:
        return None if given is None else self.token_bytes(token)  # code points, whatever was given

    def completion(self, answer: Answer, completion: Completion) -> lmi_doc.ChatCompletion:
        request = answer.request
        return {
            "id": answer.id,
            "object": "chat.completion",
            "created": answer.created,
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
        state: StreamState[lmi_doc.ChatCompletionChunk],
        choices: list[lmi_doc.StreamChoice],
        usage: Usage | None = None,
        last_of_choice: bool = False,
    ) -> lmi_doc.ChatCompletionChunk:
        return {
            "id": answer.id,
            "object": "chat.completion.chunk",
            "created": answer.created,
            "choices": choices,
        }

    def chunk_choice(
        self, index: int, delta: Shared, logprobs: Shared = None, finish_reason: Shared = None
    ) -> lmi_doc.StreamChoice:
        listed = None if logprobs is None else [logprobs]
        return {"index": index, "delta": delta, "logprobs": listed, "finish_reason": finish_reason}

    def chunks(
        self, answer: Answer, event: Event, state: StreamState[lmi_doc.ChatCompletionChunk]
    ) -> list[lmi_doc.ChatCompletionChunk]:
        """The seed's stream: the last token's line carries the finish reason. The line of a text
        the backend marked `last` waits for the Finish that comes next and takes its reason; a
        backend that cannot tell gets the finish on a line of its own."""
        held = state.held
        match event:
            case Finish(index=i, reason=reason) if i in held:
                line = held.pop(i)
                line["choices"][0]["finish_reason"] = self.finish_word(reason, answer.request)
                return [line]
        sent = [held.pop(i) for i in sorted(held)]  # anything else: nothing waits any more
        match event:
            case TextDelta(index=i, last=True):
                *ready, held[i] = super().chunks(answer, event, state)
                return [*sent, *ready]
        return [*sent, *super().chunks(answer, event, state)]

    def error_body(self, error: GatewayError, request_id: str) -> lmi_doc.ErrorResponse:
        return {
            "code": error.status,
            "type": EXCEPTION_NAMES.get(error.status, "ServerException"),
            "message": error.message,
        }


def operations(runtime: ModelDirectory, translator: Translator[Any]) -> dict[str, Handler]:
    async def ping(call: OperationCall) -> Response:
        body: lmi_doc.PingResponse = {"status": "Healthy"}
        return Response(orjson.dumps(body), media_type=JSON)

    return {"ping": ping}


DIALECT = Dialect(
    name="lmi",
    document="lmi.yaml",
    translator=LMITranslator,
    chat_operations=("createChatCompletion", "invocations"),
    operations=operations,
    probes="lmi",
)
