"""Azure AI Model Inference: POST /chat/completions and GET /info (both need `api-version`).

Messages are read in the seed's shapes (content parts {type, content, detail} on any role) as
well as the refspec's. Errors are the seed's bodies (`error`, `message`, `status`, and per
status `code`, `param`, `detail`), `error` holding Azure.Core's `{code, message}` (what the
azure-ai-inference SDK reads), with the code also in the `x-ms-error-code` header.
The `azureml-model-deployment` header names the deployment.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson
from starlette.responses import Response

from gateway.core.canonical import ChatRequest, Completion, Event, Finish, Usage
from gateway.core.errors import DeploymentForbidden, DeploymentNotFound, GatewayError
from gateway.dialects.dialect import Dialect, Handler, ModelDirectory, OperationCall
from gateway.dialects.shape import OpenAIShaped, Shared, StreamState
from gateway.dialects.translator import JSON, Answer, RenderedError, Translator

if TYPE_CHECKING:
    from typing import TypeAlias

    from generated import azure as azure_doc

    AzureError: TypeAlias = (
        azure_doc.UnauthorizedError
        | azure_doc.NotFoundError
        | azure_doc.TooManyRequestsError
        | azure_doc.ContentFilterError
        | azure_doc.UnprocessableContentError
        | azure_doc.GenericError
    )

DEPLOYMENT_HEADER = "azureml-model-deployment"


def detail_value(value: Any) -> str:
    return value if isinstance(value, str) else orjson.dumps(value).decode()


def part_read(part: Any) -> Any:
    """A content part as the seed writes it ({type, content, detail}) in the refspec's (and
    OpenAI's) shape, which every backend reads; a part already in that shape as it is."""
    if not isinstance(part, dict) or "content" not in part:
        return part
    kind = part.get("type")
    if kind == "text":
        return {"type": "text", "text": part["content"]}
    if kind in ("image", "image_url"):
        image = {"url": part["content"]}
        if part.get("detail") is not None:
            image["detail"] = part["detail"]
        return {"type": "image_url", "image_url": image}
    return part


def message_read(message: Any) -> Any:
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, list) or not any(isinstance(p, dict) and "content" in p for p in content):
        return message
    return {**message, "content": [part_read(part) for part in content]}


class AzureTranslator(
    OpenAIShaped[
        "azure_doc.ChatCompletionsOptions",
        "azure_doc.ChatCompletions",
        "azure_doc.StreamingChatCompletionsUpdate",
        "azure_doc.StreamingChatChoiceUpdate",
        "AzureError",
    ]
):
    """Neither the seed nor azure.yaml has a choice's `logprobs`."""

    usage_chunk = "never"  # the usage goes on the last finish chunk instead (chunks below)

    def read(self, body: azure_doc.ChatCompletionsOptions) -> ChatRequest:
        messages = body.get("messages")
        if isinstance(messages, list):
            body = {**body, "messages": [message_read(m) for m in messages]}
        return super().read(body)

    def completion(self, answer: Answer, completion: Completion) -> azure_doc.ChatCompletions:
        request = answer.request
        body: azure_doc.ChatCompletions = {
            "id": answer.id,
            "object": "chat.completion",
            "created": answer.created,
            "model": answer.model,
            "choices": [
                {
                    "index": c.index,
                    "message": self.message_body(c, request),
                    "finish_reason": self.finish_word(c.finish_reason, request),
                }
                for c in completion.choices
            ],
            "usage": self.usage_body(completion.usage),
        }
        if completion.served.system_fingerprint is not None:
            body["system_fingerprint"] = completion.served.system_fingerprint
        return body

    def chunk_body(
        self,
        answer: Answer,
        state: StreamState[azure_doc.StreamingChatCompletionsUpdate],
        choices: list[azure_doc.StreamingChatChoiceUpdate],
        usage: Usage | None = None,
        last_of_choice: bool = False,
    ) -> azure_doc.StreamingChatCompletionsUpdate:
        chunk: azure_doc.StreamingChatCompletionsUpdate = {
            "id": answer.id,
            "object": "chat.completion.chunk",
            "created": answer.created,
            "model": answer.model,
            "choices": choices,
        }
        if state.served.system_fingerprint is not None:
            chunk["system_fingerprint"] = state.served.system_fingerprint
        if usage is not None:
            chunk["usage"] = self.usage_body(usage)
        return chunk

    def chunk_choice(
        self, index: int, delta: Shared, logprobs: Shared = None, finish_reason: Shared = None
    ) -> azure_doc.StreamingChatChoiceUpdate:
        return {"index": index, "delta": delta, "finish_reason": finish_reason}

    def chunks(
        self, answer: Answer, event: Event, state: StreamState[azure_doc.StreamingChatCompletionsUpdate]
    ) -> list[azure_doc.StreamingChatCompletionsUpdate]:
        """azure.yaml: `usage` in the last chunk (an Azure request has no stream_options to ask
        for it), which keeps a choice, as the refspec's chunk needs one: a finish chunk waits
        for the usage that follows it."""
        match event:
            case Finish():
                sent = [state.held.pop(i) for i in sorted(state.held)]
                state.held[event.index] = super().chunks(answer, event, state)[-1]
                return sent
            case Usage():
                sent = [state.held.pop(i) for i in sorted(state.held)]
                if not sent:
                    sent = [self.chunk_body(answer, state, [])]
                sent[-1]["usage"] = self.usage_body(event)
                return sent
        return super().chunks(answer, event, state)

    def error_body(self, error: GatewayError, request_id: str) -> AzureError:
        """The seed's error body for the status (some have `code`, 400 names the `param`, 422
        says where in `detail`), its `error` Azure.Core's object, which the SDK reads."""
        described: azure_doc.ErrorObject = {"code": error.code, "message": error.message}
        match error.status:
            case 401:
                return {"error": described, "message": error.message, "status": 401}
            case 404:
                return {"error": described, "message": error.message, "status": 404}
            case 429:
                return {"error": described, "message": error.message, "status": 429}
            case 400:
                bad: azure_doc.ContentFilterError = {
                    "error": described,
                    "message": error.message,
                    "status": 400,
                    "code": error.code,
                }
                if error.param:
                    bad["param"] = error.param
                return bad
            case 422:
                location = [str(p) for p in (error.loc or ["body", error.param or ""])]
                return {
                    "error": described,
                    "message": error.message,
                    "status": 422,
                    "code": error.code,
                    "detail": {"loc": location, "value": detail_value(error.value)},
                }
        return {"error": described, "message": error.message, "status": error.status, "code": error.code}

    def error(self, error: GatewayError, request_id: str) -> RenderedError:
        if isinstance(error, DeploymentForbidden):  # a hidden deployment is not found
            error = DeploymentNotFound(error.asked, DEPLOYMENT_HEADER)
        error = self.named_unsupported(error)
        rendered = super().error(error, request_id)
        rendered.headers["x-ms-error-code"] = error.code
        return rendered


def operations(runtime: ModelDirectory, translator: Translator[Any]) -> dict[str, Handler]:
    async def get_model_info(call: OperationCall) -> Response:
        deployment = runtime.router.route(None, call.headers.get(DEPLOYMENT_HEADER))
        if not call.caller.may_use(deployment.name):
            raise DeploymentForbidden(deployment.name)
        body: azure_doc.ModelInfo = {
            "model_name": deployment.model,
            "model_type": "chat_completion",
            "model_provider_name": deployment.provider,
        }
        return Response(orjson.dumps(body), media_type=JSON)

    return {"getModelInfo": get_model_info}


DIALECT = Dialect(
    name="azure",
    document="azure.yaml",
    translator=AzureTranslator,
    chat_operations=("getChatCompletions",),
    operations=operations,
    routing_header=DEPLOYMENT_HEADER,
    probes="azure",
)
