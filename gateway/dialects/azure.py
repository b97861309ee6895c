"""Azure AI Model Inference: POST /chat/completions and GET /info (both need `api-version`).

Errors are the seed's flat bodies (`error`, `message`, `status`, and per status `code`,
`param`, `detail`) with the machine-readable code in the `x-ms-error-code` header.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.datastructures import Headers
from starlette.responses import Response

from gateway.core.errors import GatewayError, NotFound
from gateway.dialects.base import JSON, Dialect

SHORT_DESCRIPTIONS = {
    400: "Bad request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not found",
    405: "Method not allowed",
    413: "Payload too large",
    415: "Unsupported media type",
    422: "Unprocessable content",
    429: "Too many requests",
    500: "Internal server error",
    502: "Bad gateway",
    503: "Service unavailable",
    504: "Gateway timeout",
}
# Statuses whose documented body has no `code` field.
CODELESS = frozenset({401, 404, 429})


def detail_value(value: Any) -> str:
    return value if isinstance(value, str) else orjson.dumps(value).decode()


class Azure(Dialect):
    name = "azure"
    spec_file = "azure.yaml"
    default_mount = "/azure"
    chat_operations = ("getChatCompletions",)

    async def get_chat_completions(self, api_version: str) -> Response:
        return await self.chat_operation()

    async def get_model_info(self, api_version: str) -> Response:
        from connexion.context import scope

        headers = Headers(scope=scope._get_current_object())
        deployment = self.runtime.router.route(None, headers.get("azureml-model-deployment"))
        body = {
            "model_name": deployment.model,
            "model_type": "chat_completion",
            "model_provider_name": deployment.config.provider,
        }
        return Response(orjson.dumps(body), media_type=JSON)

    def forbidden_deployment(self, deployment: str) -> NotFound:
        return NotFound(
            f"Deployment '{deployment}' not found.",
            param="azureml-model-deployment",
            code="DeploymentNotFound",
        )

    def error_body(self, error: GatewayError, request_id: str) -> dict[str, Any]:
        status = error.status
        body: dict[str, Any] = {
            "error": SHORT_DESCRIPTIONS.get(status, "Error"),
            "message": error.message,
            "status": status,
        }
        if status not in CODELESS:
            body["code"] = error.code
        if status == 400 and error.param:
            body["param"] = error.param
        if status == 422:
            body["detail"] = [
                {
                    "loc": [str(p) for p in (error.loc or ["body", error.param or ""])],
                    "value": detail_value(error.value),
                }
            ]
        return body

    def error_headers(self, error: GatewayError) -> dict[str, str]:
        return {**error.headers, "x-ms-error-code": error.code}
