"""OpenAI: POST /chat/completions (JSON or SSE), GET /models, GET /models/{model} (both showing
only what the caller's key may use)."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import orjson
from starlette.responses import Response

from gateway.core.canonical import Completion, Usage
from gateway.core.errors import DeploymentForbidden, GatewayError, ModelNotFound, NotFound
from gateway.dialects import responses
from gateway.dialects.dialect import Dialect, Handler, ModelDirectory, OperationCall, OwnChat
from gateway.dialects.shape import OpenAIShaped, Shared, StreamState
from gateway.dialects.translator import JSON, Answer, RenderedError, Translator

if TYPE_CHECKING:
    from generated import openai as openai_doc


def model_not_found(model: str) -> NotFound:
    """OpenAI's words for a model that is unknown or hidden from this key (the same, on purpose)."""
    return NotFound(
        f"The model '{model}' does not exist or you do not have access to it.",
        param="model",
        code="model_not_found",
    )


class OpenAITranslator(
    OpenAIShaped[
        "openai_doc.CreateChatCompletionRequest",
        "openai_doc.CreateChatCompletionResponse",
        "openai_doc.CreateChatCompletionStreamResponse",
        "openai_doc.ChatCompletionStreamChoice",
        "openai_doc.ErrorResponse",
    ]
):
    refusal_field = True  # OpenAI always sends `refusal`, null when the model did not refuse
    logprobs_refusal = True
    usage_details = True

    def completion(self, answer: Answer, completion: Completion) -> openai_doc.CreateChatCompletionResponse:
        request = answer.request
        body: openai_doc.CreateChatCompletionResponse = {
            "id": answer.id,
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
        }
        served = completion.served
        if served.service_tier is not None:
            body["service_tier"] = served.service_tier
        if served.system_fingerprint is not None:
            body["system_fingerprint"] = served.system_fingerprint
        body["usage"] = self.usage_body(completion.usage)
        return body

    def chunk_body(
        self,
        answer: Answer,
        state: StreamState[openai_doc.CreateChatCompletionStreamResponse],
        choices: list[openai_doc.ChatCompletionStreamChoice],
        usage: Usage | None = None,
        last_of_choice: bool = False,
    ) -> openai_doc.CreateChatCompletionStreamResponse:
        chunk: openai_doc.CreateChatCompletionStreamResponse = {
            "id": answer.id,
            "object": "chat.completion.chunk",
            "created": answer.created,
            "model": answer.model,
            "choices": choices,
        }
        served = state.served
        if served.service_tier is not None:
            chunk["service_tier"] = served.service_tier
        if served.system_fingerprint is not None:
            chunk["system_fingerprint"] = served.system_fingerprint
        if usage is not None:
            chunk["usage"] = self.usage_body(usage)
        elif answer.request.include_usage:  # null in every chunk before the usage chunk
            chunk["usage"] = None
        return chunk

    def chunk_choice(
        self, index: int, delta: Shared, logprobs: Shared = None, finish_reason: Shared = None
    ) -> openai_doc.ChatCompletionStreamChoice:
        return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}

    def error_body(self, error: GatewayError, request_id: str) -> openai_doc.ErrorResponse:
        return {
            "error": {
                "message": error.message,
                "type": error.kind,
                "param": error.param,
                "code": error.code,
            }
        }

    def error(self, error: GatewayError, request_id: str) -> RenderedError:
        # a model hidden from the key reads exactly as one that does not exist
        if isinstance(error, DeploymentForbidden):
            error = model_not_found(error.asked)
        elif isinstance(error, ModelNotFound):
            error = model_not_found(error.model)
        return super().error(error, request_id)


def model_body(model_id: str, created: int) -> openai_doc.Model:
    return {"id": model_id, "object": "model", "created": created, "owned_by": "chatgate"}


def operations(runtime: ModelDirectory, translator: Translator[Any]) -> dict[str, Handler]:
    async def list_models(call: OperationCall) -> Response:
        listed: openai_doc.ListModelsResponse = {
            "object": "list",
            "data": [
                model_body(name, runtime.started) for name in runtime.router.model_names(call.caller.may_use)
            ],
        }
        return Response(orjson.dumps(listed), media_type=JSON)

    async def retrieve_model(call: OperationCall) -> Response:
        model = call.path_params["model"]
        try:
            deployment = runtime.router.route(model)
        except ModelNotFound:
            raise model_not_found(model) from None
        if not call.caller.may_use(deployment.name):  # hidden from this key: as if not there
            raise model_not_found(model)
        return Response(orjson.dumps(model_body(model, runtime.started)), media_type=JSON)

    return {
        "listModels": list_models,
        "retrieveModel": retrieve_model,
        **responses.operations(runtime, translator),
    }


DIALECT = Dialect(
    name="openai",
    document="openai.yaml",
    translator=OpenAITranslator,
    chat_operations=("createChatCompletion",),
    # the Responses API: its own translator (errors written as this dialect's) and stored responses
    own_chat={
        "createResponse": OwnChat(
            translator=functools.partial(responses.ResponsesTranslator, errors=OpenAITranslator),
            hook=responses.ResponseKeeping,
            probes="responses",
        )
    },
    operations=operations,
    probes="openai",
)
