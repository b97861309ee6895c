"""DJL LMI / SageMaker: POST /v1/chat/completions and /invocations (chat when the body has
`messages`), GET /ping. Streams are JSON lines; finish reasons `length`, `eos_token`,
`stop_sequence`; `usage` always in the completion; errors as DJL Serving's `{code, type, message}`."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response

from gateway.core.canonical import TokenLogprob
from gateway.core.errors import GatewayError
from gateway.dialects.base import JSON, Dialect, ResponseContext
from gateway.framing import JSONLines

EXCEPTION_NAMES = {
    400: "BadRequestException",
    401: "UnauthorizedException",
    403: "ForbiddenException",
    404: "ModelNotFoundException",
    413: "PayloadTooLargeException",
    415: "BadRequestException",
    422: "BadRequestException",
    429: "ServiceUnavailableException",
    500: "InternalServerException",
    502: "BadGatewayException",
    503: "ServiceUnavailableException",
    504: "TimeoutException",
}


class LMI(Dialect):
    name = "lmi"
    spec_file = "lmi.yaml"
    default_mount = "/lmi"
    finish_delta = {"content": ""}
    separate_role_chunk = False  # LMI's first chunk carries the role and the first token
    chat_operations = ("createChatCompletion", "invocations")
    framing = JSONLines
    finish_reasons = {
        "stop": "eos_token",
        "stop_sequence": "stop_sequence",
        "length": "length",
        "tool_calls": "eos_token",
        "content_filter": "stop_sequence",
    }

    async def create_chat_completion(self) -> Response:
        return await self.chat_operation()

    async def invocations(self) -> Response:
        return await self.chat_operation()

    async def ping(self) -> Response:
        return Response(orjson.dumps({"status": "Healthy"}), media_type=JSON)

    def completion_body(self, ctx: ResponseContext, completion: Any) -> dict[str, Any]:
        body = super().completion_body(ctx, completion)
        del body["model"]
        return body

    def chunk_body(self, ctx: ResponseContext, choices: list[dict[str, Any]], usage=None):
        body = super().chunk_body(ctx, choices, None)
        del body["model"]
        return body

    @staticmethod
    def token_bytes(token: str) -> list[int] | None:
        # LMI builds `bytes` as Unicode code points, and null for an empty token.
        return [ord(c) for c in token] or None

    def logprobs_body(self, logprobs: list[TokenLogprob] | None) -> dict[str, Any] | None:
        body = super().logprobs_body(logprobs)
        if body is not None:
            del body["refusal"]
        return body

    def chunk_choice(
        self,
        index: int,
        delta: dict[str, Any],
        logprobs: list[TokenLogprob] | None = None,
        finish_reason: str | None = None,
    ) -> dict[str, Any]:
        # LMI streams `logprobs` as a one-element list around the object (see lmi.yaml).
        choice = super().chunk_choice(index, delta, logprobs, finish_reason)
        if choice["logprobs"] is not None:
            choice["logprobs"] = [choice["logprobs"]]
        return choice

    def error_body(self, error: GatewayError, request_id: str) -> dict[str, Any]:
        return {
            "code": error.status,
            "type": EXCEPTION_NAMES.get(error.status, "ServerException"),
            "message": error.message,
        }
