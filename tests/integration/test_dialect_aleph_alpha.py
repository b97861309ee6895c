"""The Aleph Alpha dialect at /aleph-alpha, driven by the official aleph-alpha-client."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import httpx
import pytest
import yaml
from aleph_alpha_client import AsyncClient, ChatRequest, Client, Message
from aleph_alpha_client.chat import ChatStreamChunk, FinishReason, Role, StreamOptions, ToolCall, Usage
from aleph_alpha_client.structured_output import JSONSchema
from pydantic import BaseModel

from backends.echo import PREFIX
from tests.support.servers import running_gateway

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


@pytest.mark.parametrize(
    "roles",
    [["user", "assistant", "tool"], ["user", "assistant", "tool", "tool", "assistant", "user"]],
    ids=["ends with a tool result", "tool results, then the user"],
)
def test_tool_results_take_the_users_turn(host: str, roles: list[str]):
    body = {"model": "echo", "messages": [{"role": r, "content": "x"} for r in roles]}
    assert httpx.post(f"{host}/chat/completions", json=body).status_code == 200


@pytest.mark.parametrize(
    ("roles", "bad_index"),
    [(["user", "tool"], 1), (["tool", "user"], 0), (["user", "assistant", "tool", "user"], 3)],
)
def test_a_tool_result_elsewhere_breaks_the_order(host: str, roles: list[str], bad_index: int):
    body = {"model": "echo", "messages": [{"role": r, "content": "x"} for r in roles]}
    response = httpx.post(f"{host}/chat/completions", json=body)
    assert response.status_code == 400
    assert f"messages[{bad_index}]" in response.json()["error"]


def test_rejected_and_ignored_parameters(host: str):
    messages = [{"role": "user", "content": "x"}]
    rejected = httpx.post(
        f"{host}/chat/completions",
        json={"model": "echo", "messages": messages, "parallel_tool_calls": True},
    )
    assert rejected.status_code == 400
    assert rejected.json() == {
        "error": "The parameter 'parallel_tool_calls' is not supported by this API.",
        "code": "UNSUPPORTED_PARAMETER",
    }
    ignored = httpx.post(f"{host}/chat/completions", json={"model": "echo", "messages": messages, "seed": 3})
    assert ignored.status_code == 200


# ----- what the client 11.5.1 sends today (Aleph Alpha's 4.7.0 document) ------------------------


class Answer(BaseModel):
    river: str
    length_km: int


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def test_structured_output_with_a_pydantic_model(host: str):
    client = Client(token="unused", host=host, total_retries=0)
    request = ChatRequest(model="echo", messages=MESSAGES, response_format=Answer)
    response = client.chat(request, model="echo")
    answer = Answer.model_validate_json(response.message.content)  # echo: JSON that fits the schema
    assert isinstance(answer.length_km, int)


def test_structured_output_with_a_json_schema(host: str):
    client = Client(token="unused", host=host, total_retries=0)
    schema = JSONSchema(
        schema={"type": "object", "properties": {"nemo": {"type": "string"}}, "required": ["nemo"]},
        name="aquarium",
        description="Describe nemo",
        strict=True,
    )
    response = client.chat(ChatRequest(model="echo", messages=MESSAGES, response_format=schema), model="echo")
    assert set(json.loads(response.message.content)) == {"nemo"}


def test_tools(host: str):
    client = Client(token="unused", host=host, total_retries=0)
    request = ChatRequest(
        model="echo",
        messages=[Message(role=Role.User, content="Berlin")],
        tools=[WEATHER],
        tool_choice="required",
    )
    response = client.chat(request, model="echo")
    assert response.finish_reason == FinishReason.ToolCalls
    (call,) = response.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Berlin"}
    # the result goes back as a `tool` message, and the conversation goes on
    follow_up = ChatRequest(
        model="echo",
        messages=[
            Message(role=Role.User, content="Berlin"),
            response.message,
            Message(role=Role.Tool, content="18 degrees", tool_call_id=call.id),
        ],
        tools=[WEATHER],
    )
    assert client.chat(follow_up, model="echo").finish_reason == FinishReason.Stop


def test_tools_streamed(host: str):
    async def stream() -> list:
        async with AsyncClient(token="unused", host=host, total_retries=0) as client:
            request = ChatRequest(
                model="echo",
                messages=[Message(role=Role.User, content="Berlin")],
                tools=[WEATHER],
                tool_choice={"type": "function", "function": {"name": "get_weather"}},
            )
            return [item async for item in client.chat_with_streaming(request, model="echo")]

    items = asyncio.run(stream())
    (call,) = [i for i in items if isinstance(i, ToolCall)]
    assert call.function.name == "get_weather"
    assert items[-1] == FinishReason.ToolCalls


def test_top_k_steering_concepts_and_list_content(host: str):
    client = Client(token="unused", host=host, total_retries=0)
    request = ChatRequest(
        model="echo",
        messages=[Message(role=Role.User, content=["Name a", "German river"])],
        top_k=5,
        steering_concepts=["concept-1"],
    )
    response = client.chat(request, model="echo")
    assert response.message.content == f"{PREFIX} Name a German river"


def test_models_lists_what_the_key_may_use(host: str):
    client = Client(token="unused", host=host, total_retries=0)
    models = client.models()
    assert {"name": "echo", "description": models[0]["description"], "chat": True} in models


NARROW_CONFIG = {
    "deployments": [
        {
            "name": "plain",
            "backend": "echo",
            "capabilities": {
                "unsupported_parameters": ["steering_concepts", "top_k", "tools", "response_format"]
            },
        }
    ]
}


@pytest.fixture(scope="module")
def narrow_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("aleph-narrow")
    config = folder / "config.yaml"
    config.write_text(yaml.safe_dump(NARROW_CONFIG))
    with running_gateway(folder, config) as url:
        yield f"{url}/aleph-alpha"


@pytest.mark.parametrize(
    ("parameter", "request_fields"),
    [
        ("steering_concepts", {"steering_concepts": ["concept-1"]}),
        ("top_k", {"top_k": 5}),
        ("tools", {"tools": [WEATHER]}),
        ("response_format", {"response_format": Answer}),
    ],
)
def test_a_model_without_a_parameter_refuses_it_by_name(narrow_host: str, parameter: str, request_fields):
    """Never dropped in silence: 422 "not supported by this model", naming the parameter."""
    client = Client(token="unused", host=narrow_host, total_retries=0)
    with pytest.raises(RuntimeError) as raised:
        client.chat(ChatRequest(model="plain", messages=MESSAGES, **request_fields), model="plain")
    status, text = raised.value.args
    assert status == 422
    body = json.loads(text)
    assert parameter in body["error"] and body["code"] == "UNSUPPORTED_PARAMETER"
