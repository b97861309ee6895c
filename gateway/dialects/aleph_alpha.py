"""Aleph Alpha: POST /chat/completions. Strict message order; "ignored" and "rejected" parameters;
errors as `{"error": message, "code": UPPER_SNAKE}`; missing logprobs reported as -9999.0; in
streams `usage` null but in the usage chunk, `system_fingerprint` only in a choice's last chunk."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from gateway.core.canonical import ChatRequest
from gateway.core.errors import BadRequest, GatewayError
from gateway.dialects.dialect import Dialect
from gateway.dialects.shape import OpenAIShaped

if TYPE_CHECKING:
    from generated import aleph_alpha as aleph_alpha_doc


def upper_snake(code: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", code).upper()


def check_message_order(messages: list[dict[str, Any]]) -> None:
    """One optional system message first, then user/assistant alternating, first and last user."""
    roles = [m.get("role") for m in messages]
    body = roles[1:] if roles and roles[0] == "system" else roles
    for position, role in enumerate(body):
        expected = "user" if position % 2 == 0 else "assistant"
        if role != expected:
            index = position + (len(roles) - len(body))
            raise BadRequest(
                f"messages[{index}] has role '{role}' where '{expected}' is required: after one "
                "optional system message, messages must alternate user/assistant, "
                "beginning and ending with user.",
                param="messages",
                loc=["body", "messages", index, "role"],
                value=role,
            )
    if not body or body[-1] != "user":
        raise BadRequest(
            "The conversation must contain a user message and end with one.",
            param="messages",
            loc=["body", "messages"],
        )


class AlephAlphaTranslator(OpenAIShaped):
    finish_delta = {"content": ""}
    missing_logprob = -9999.0  # the seed's fallback
    null_bytes = False  # the seed: the token's UTF-8 bytes, always a list
    usage_in_chunks = "null"  # the seed: null in stream chunks unless the usage chunk
    served_fields = ("system_fingerprint",)
    fingerprint_in_last_chunk = True  # the seed: set in a completion's last chunk, null otherwise

    def check(self, request: ChatRequest) -> None:
        check_message_order(request.messages)

    def error_body(self, error: GatewayError, request_id: str) -> aleph_alpha_doc.ErrorResponse:
        return {"error": error.message, "code": upper_snake(error.code)}


DIALECT = Dialect(
    name="aleph_alpha",
    document="aleph_alpha.yaml",
    default_mount="/aleph-alpha",
    translator=AlephAlphaTranslator,
    chat_operations=("createChatCompletion",),
)
