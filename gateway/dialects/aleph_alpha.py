"""Aleph Alpha: POST /chat/completions and GET /models_available (the official client's
`models()`). Strict message order (tool results take the user's turn); "ignored" and "rejected" parameters;
errors as `{"error": message, "code": UPPER_SNAKE}`; missing logprobs reported as -9999.0; in
streams `usage` null but in the usage chunk, `system_fingerprint` only in a choice's last chunk."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import orjson
from starlette.responses import Response

from gateway.core.canonical import ChatRequest, Choice, Completion, Event, Usage
from gateway.core.errors import BadRequest, GatewayError
from gateway.dialects.dialect import Dialect, Handler, ModelDirectory, OperationCall
from gateway.dialects.shape import OpenAIShaped, Shared, StreamState
from gateway.dialects.translator import JSON, Answer, Translator

if TYPE_CHECKING:
    from generated import aleph_alpha as aleph_alpha_doc


def upper_snake(code: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", code).upper()


def turns(roles: list[Any]) -> list[Any]:
    """The roles as turns: a run of `tool` messages right after an assistant message is the
    turn the user would take (aleph_alpha.yaml's reading at `role`)."""
    read: list[Any] = []
    for position, role in enumerate(roles):
        if role == "tool" and position > 0 and roles[position - 1] in ("assistant", "tool"):
            read.append("user" if roles[position - 1] == "assistant" else None)
        else:
            read.append(role)
    return read


def check_message_order(messages: list[dict[str, Any]]) -> None:
    """One optional system message first, then user/assistant alternating, first and last user
    (tool results after an assistant's calls taking the user's turn)."""
    roles = [m.get("role") for m in messages]
    read = turns(roles)
    first = 1 if roles and roles[0] == "system" else 0
    body = [(index, role) for index, role in enumerate(read) if index >= first and role is not None]
    for position, (index, role) in enumerate(body):
        expected = "user" if position % 2 == 0 else "assistant"
        if role != expected:
            role = roles[index]
            raise BadRequest(
                f"messages[{index}] has role '{role}' where '{expected}' is required: after one "
                "optional system message, messages must alternate user/assistant, "
                "beginning and ending with user.",
                param="messages",
                loc=["body", "messages", index, "role"],
                value=role,
            )
    if not body or body[-1][1] != "user":
        raise BadRequest(
            "messages: the conversation must contain a user message and end with one.",
            param="messages",
            loc=["body", "messages"],
        )


class AlephAlphaTranslator(
    OpenAIShaped[
        "aleph_alpha_doc.ChatRequest",
        "aleph_alpha_doc.ChatResponse",
        "aleph_alpha_doc.ChatStreamChunk",
        "aleph_alpha_doc.ChatStreamChoice",
        "aleph_alpha_doc.ErrorResponse",
    ]
):
    finish_delta = {"content": ""}
    missing_logprob = -9999.0  # the seed's fallback
    null_bytes = False  # the seed: the token's UTF-8 bytes, always a list

    def check(self, request: ChatRequest) -> None:
        check_message_order(request.messages)

    def completion(self, answer: Answer, completion: Completion) -> aleph_alpha_doc.ChatResponse:
        request = answer.request
        body: aleph_alpha_doc.ChatResponse = {
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
            "usage": self.usage_body(completion.usage),
        }
        if completion.served.system_fingerprint is not None:
            body["system_fingerprint"] = completion.served.system_fingerprint
        return body

    def chunk_body(
        self,
        answer: Answer,
        state: StreamState[aleph_alpha_doc.ChatStreamChunk],
        choices: list[aleph_alpha_doc.ChatStreamChoice],
        usage: Usage | None = None,
        last_of_choice: bool = False,
    ) -> aleph_alpha_doc.ChatStreamChunk:
        """The seed: `system_fingerprint` set in a choice's last chunk, null in the others;
        `usage` null in every chunk but the usage chunk."""
        return {
            "id": answer.id,
            "object": "chat.completion.chunk",
            "created": answer.created,
            "model": answer.model,
            "choices": choices,
            "system_fingerprint": state.served.system_fingerprint if last_of_choice else None,
            "usage": None if usage is None else self.usage_body(usage),
        }

    def chunk_choice(
        self, index: int, delta: Shared, logprobs: Shared = None, finish_reason: Shared = None
    ) -> aleph_alpha_doc.ChatStreamChoice:
        return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}

    def message_body(self, choice: Choice, request: ChatRequest) -> Shared:
        """The document's message always has text `content` (the client reads it): empty, not
        null, beside tool calls."""
        message = super().message_body(choice, request)
        if message["content"] is None:
            message["content"] = ""
        return message

    def chunks(
        self, answer: Answer, event: Event, state: StreamState[aleph_alpha_doc.ChatStreamChunk]
    ) -> list[aleph_alpha_doc.ChatStreamChunk]:
        """Every delta has text `content` (the document requires it; the client reads it)."""
        sent = super().chunks(answer, event, state)
        for chunk in sent:
            for choice in chunk["choices"]:
                if choice["delta"].get("content", "") is None:
                    choice["delta"]["content"] = ""
        return sent

    def error_body(self, error: GatewayError, request_id: str) -> aleph_alpha_doc.ErrorResponse:
        return {"error": error.message, "code": upper_snake(error.code)}


def model_body(name: str) -> aleph_alpha_doc.AvailableModel:
    return {
        "name": name,
        "description": f"A chat model served by chatgate (deployment {name}).",
        "chat": True,
    }


def operations(runtime: ModelDirectory, translator: Translator[Any]) -> dict[str, Handler]:
    async def list_models_available(call: OperationCall) -> Response:
        listed = [model_body(name) for name in runtime.router.model_names(call.caller.may_use)]
        return Response(orjson.dumps(listed), media_type=JSON)

    return {"listModelsAvailable": list_models_available}


DIALECT = Dialect(
    name="aleph_alpha",
    document="aleph_alpha.yaml",
    translator=AlephAlphaTranslator,
    chat_operations=("createChatCompletion",),
    operations=operations,
    probes="aleph_alpha",
)
