"""The Aleph Alpha dialect at /aleph-alpha, driven by the official aleph-alpha-client."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from aleph_alpha_client import AsyncClient, ChatRequest, Client, Message
from aleph_alpha_client.chat import ChatStreamChunk, FinishReason, Role, StreamOptions, Usage

from backends.echo import PREFIX

MESSAGES = [
    Message(role=Role.System, content="Be brief."),
    Message(role=Role.User, content="Name a German river"),
]


@pytest.fixture(scope="module")
def host(gateway_url: str) -> str:
    return f"{gateway_url}/aleph-alpha"


def test_chat(host: str):
    client = Client(token="unused", host=host, total_retries=0)
    response = client.chat(ChatRequest(model="echo", messages=MESSAGES), model="echo")
    assert response.message.content == f"{PREFIX} Name a German river"
    assert response.finish_reason == FinishReason.Stop


def test_chat_with_maximum_tokens(host: str):
    """The client sends its token limit as `maximum_tokens` (aleph_alpha.yaml reads it as max_tokens)."""
    client = Client(token="unused", host=host, total_retries=0)
    request = ChatRequest(model="echo", messages=MESSAGES, maximum_tokens=3)
    response = client.chat(request, model="echo")
    assert response.message.content == "[chatgate echo backend,"
    assert response.finish_reason == FinishReason.Length


def test_chat_streaming_with_usage(host: str):
    async def stream() -> list:
        async with AsyncClient(token="unused", host=host, total_retries=0) as client:
            request = ChatRequest(
                model="echo",
                messages=MESSAGES,
                maximum_tokens=None,
                stream_options=StreamOptions(include_usage=True),
            )
            return [item async for item in client.chat_with_streaming(request, model="echo")]

    items = asyncio.run(stream())
    text = "".join(i.content for i in items if isinstance(i, ChatStreamChunk))
    assert text == f"{PREFIX} Name a German river"
    assert FinishReason.Stop in items
    (usage,) = [i for i in items if isinstance(i, Usage)]
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens > 0


@pytest.mark.parametrize(
    ("roles", "bad_index"),
    [
        (["assistant"], 0),
        (["system", "system", "user"], 1),
        (["user", "user"], 1),
        (["user", "assistant"], None),
        (["system"], None),
        (["user", "system", "user"], 1),
    ],
)
def test_message_order_is_enforced(host: str, roles: list[str], bad_index: int | None):
    body = {"model": "echo", "messages": [{"role": r, "content": "x"} for r in roles]}
    response = httpx.post(f"{host}/chat/completions", json=body)
    assert response.status_code == 400
    error = response.json()
    assert set(error) == {"error", "code"}
    assert error["code"] == "BAD_REQUEST"
    if bad_index is not None:
        assert f"messages[{bad_index}]" in error["error"]


def test_rejected_and_ignored_parameters(host: str):
    messages = [{"role": "user", "content": "x"}]
    rejected = httpx.post(
        f"{host}/chat/completions",
        json={"model": "echo", "messages": messages, "tools": [{"type": "function"}]},
    )
    assert rejected.status_code == 400
    assert "tools" in rejected.json()["error"]
    ignored = httpx.post(f"{host}/chat/completions", json={"model": "echo", "messages": messages, "seed": 3})
    assert ignored.status_code == 200
