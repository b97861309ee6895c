"""The client dialects the bench sends through chatgate: the same question in each.

Each dialect asks the same deployments on the same nginx upstream (bench/upstream.py) the same
thing — one system line and one user line, 64 tokens at most — in its own shape, so what the
dialects cost apart is their translation alone. The Responses requests say `store: false`, as
Codex sends them: storing a response is work chat has no part in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench.upstream import MODEL, REQUEST

SYSTEM = REQUEST["messages"][0]["content"]
QUESTION = REQUEST["messages"][1]["content"]
STREAM_MODEL = MODEL + "-stream"  # the deployment whose upstream answers with the stream


@dataclass(frozen=True)
class Dialect:
    key: str  # the bench's contender key for its plain requests
    label: str
    path: str
    request: dict[str, Any]
    done: bytes  # what a whole stream's last event holds
    text: Callable[[dict[str, Any]], str]  # the generated text of a plain answer

    @property
    def stream_request(self) -> dict[str, Any]:
        return {**self.request, "model": STREAM_MODEL, "stream": True}


def chat_text(answer: dict[str, Any]) -> str:
    return answer["choices"][0]["message"]["content"]


def messages_text(answer: dict[str, Any]) -> str:
    return "".join(block["text"] for block in answer["content"] if block["type"] == "text")


def responses_text(answer: dict[str, Any]) -> str:
    return "".join(
        part["text"]
        for item in answer["output"]
        if item["type"] == "message"
        for part in item["content"]
        if part["type"] == "output_text"
    )


CHAT = Dialect("upstream", "chat completions", "/v1/chat/completions", REQUEST, b"data: [DONE]", chat_text)
MESSAGES = Dialect(
    "messages",
    "Messages",
    "/anthropic/v1/messages",
    {"model": MODEL, "system": SYSTEM, "messages": [REQUEST["messages"][1]], "max_tokens": 64},
    b"message_stop",
    messages_text,
)
RESPONSES = Dialect(
    "responses",
    "Responses",
    "/v1/responses",
    {
        "model": MODEL,
        "instructions": SYSTEM,
        "input": [{"role": "user", "content": QUESTION}],
        "max_output_tokens": 64,
        "store": False,
    },
    b"response.completed",
    responses_text,
)
DIALECTS = {"chat": CHAT, "messages": MESSAGES, "responses": RESPONSES}
