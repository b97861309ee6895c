"""OpenAI: POST /chat/completions (JSON or SSE), GET /models, GET /models/{model}."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response

from gateway.core.canonical import Choice
from gateway.core.errors import NotFound
from gateway.dialects.base import JSON, Dialect


class OpenAI(Dialect):
    name = "openai"
    spec_file = "openai.yaml"
    default_mount = "/v1"
    chat_operations = ("createChatCompletion",)

    async def create_chat_completion(self) -> Response:
        return await self.chat_operation()

    def message_body(self, choice: Choice) -> dict[str, Any]:
        # OpenAI always sends `refusal`, null when the model did not refuse
        return {**super().message_body(choice), "refusal": None}

    def forbidden_deployment(self, deployment: str) -> NotFound:
        return NotFound(
            f"The model '{deployment}' does not exist or you do not have access to it.",
            param="model",
            code="model_not_found",
        )

    def model_body(self, model_id: str) -> dict[str, Any]:
        return {
            "id": model_id,
            "object": "model",
            "created": self.runtime.started,
            "owned_by": "chatgate",
        }

    async def list_models(self) -> Response:
        data = [self.model_body(name) for name in self.runtime.router.model_names()]
        return Response(orjson.dumps({"object": "list", "data": data}), media_type=JSON)

    async def retrieve_model(self, model: str) -> Response:
        if not self.runtime.router.knows(model):
            raise NotFound(
                f"The model '{model}' does not exist or you do not have access to it.",
                param="model",
                code="model_not_found",
            )
        return Response(orjson.dumps(self.model_body(model)), media_type=JSON)
