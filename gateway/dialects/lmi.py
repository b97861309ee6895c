"""DJL LMI / SageMaker: POST /v1/chat/completions and /invocations (chat when the body has
`messages`), GET /ping. Streams are JSON lines; finish reasons `length`, `eos_token`,
`stop_sequence`; `usage` always in the completion; errors as DJL Serving's `{code, type, message}`."""

from __future__ import annotations

from typing import TYPE_CHECKING

import orjson
from starlette.responses import Response

from gateway.core.errors import GatewayError
from gateway.dialects.dialect import Dialect, Handler
from gateway.dialects.shape import JSON, OpenAIShaped
from gateway.framing import JSONLines

if TYPE_CHECKING:
    from gateway.call import Call
    from gateway.runtime import Runtime
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


class LMITranslator(OpenAIShaped):
    framing = JSONLines
    finish_delta = {"content": ""}
    separate_role_chunk = False  # LMI's first chunk carries the role and the first token
    model_in_bodies = False
    refusal_in_logprobs = False
    logprobs_listed_in_chunks = True  # see lmi.yaml
    finish_reasons = {
        "stop": "eos_token",
        "stop_sequence": "stop_sequence",
        "length": "length",
        "tool_calls": "eos_token",
        "content_filter": "stop_sequence",
    }

    @staticmethod
    def token_bytes(token: str) -> list[int] | None:
        # LMI builds `bytes` as Unicode code points, and null for an empty token.
        return [ord(c) for c in token] or None

    def error_body(self, error: GatewayError, request_id: str) -> lmi_doc.ErrorResponse:
        return {
            "code": error.status,
            "type": EXCEPTION_NAMES.get(error.status, "ServerException"),
            "message": error.message,
        }


def operations(runtime: Runtime, translator: OpenAIShaped) -> dict[str, Handler]:
    async def ping(call: Call) -> Response:
        body: lmi_doc.PingResponse = {"status": "Healthy"}
        return Response(orjson.dumps(body), media_type=JSON)

    return {"ping": ping}


DIALECT = Dialect(
    name="lmi",
    document="lmi.yaml",
    default_mount="/lmi",
    translator=LMITranslator,
    chat_operations=("createChatCompletion", "invocations"),
    operations=operations,
)
