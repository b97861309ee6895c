"""The official `anthropic` Python SDK (pinned in the test extra) against a real `chatgate serve`
at /anthropic: on the echo backend with keys (create, the stream helper's text and final
message, a forced tool call then its tool_result turn, count_tokens, the models list, a 400 and
a 401 read as the SDK's typed errors), and in front of llama.cpp's real server (a plain turn, a
stream and a forced tool call that comes back as a `tool_use` block)."""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import httpx
import pytest
import yaml

from gateway.policy.auth import new_key
from tests.support.real_server_fixtures import (  # noqa: F401 (fixtures)
    DEPLOYMENT,
    Upstream,
    llama_cpp_upstream,
    model_dir,
)
from tests.support.servers import running_gateway

PREFIX = "[chatgate echo backend, not a language model] You said: "
KEY, KEY_SHA = new_key()
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
GREEDY = {"temperature": 0}  # the SDK no longer names temperature; the document still takes it
CLAUDE_CODE_BETA = "claude-code-20250219,interleaved-thinking-2025-05-14"


def tool_result(tool_use_id: str) -> dict[str, str]:
    return {"type": "tool_result", "tool_use_id": tool_use_id, "content": "sunny"}


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A gateway on its embedded echo deployment, keys required."""
    folder = tmp_path_factory.mktemp("anthropic-sdk")
    config = folder / "chatgate.yaml"
    config.write_text(yaml.safe_dump({"keys": [{"name": "sdk", "sha256": KEY_SHA}]}))
    with running_gateway(folder, config) as url:
        yield f"{url}/anthropic"


@pytest.fixture(scope="module")
def client(base_url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=base_url, api_key=KEY, max_retries=0)


def test_create(client: anthropic.Anthropic):
    message = client.messages.create(
        model="echo",
        max_tokens=64,
        system="Be brief.",
        messages=[{"role": "user", "content": "Name a river"}],
    )
    assert message.id.startswith("msg_") and message.role == "assistant"
    (block,) = message.content
    assert block.type == "text" and block.text == f"{PREFIX}Name a river"
    assert message.stop_reason == "end_turn" and message.stop_sequence is None
    assert message.usage.input_tokens > 0 and message.usage.output_tokens > 0


def test_the_stop_sequence_that_matched(client: anthropic.Anthropic):
    message = client.messages.create(
        model="echo",
        max_tokens=64,
        stop_sequences=["river", "said"],
        messages=[{"role": "user", "content": "Name a river"}],
    )
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", "said")
    assert message.content[0].text == PREFIX.removesuffix("said: ")


def test_stream_helper(client: anthropic.Anthropic):
    with client.messages.stream(
        model="echo", max_tokens=64, messages=[{"role": "user", "content": "Stream it"}]
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == f"{PREFIX}Stream it"
    assert final.content[0].text == text and final.stop_reason == "end_turn"
    assert final.usage.output_tokens > 0


def test_stream_length_and_raw_events(client: anthropic.Anthropic):
    events = list(
        client.messages.create(
            model="echo", max_tokens=3, stream=True, messages=[{"role": "user", "content": "Long words here"}]
        )
    )
    kinds = [event.type for event in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") == 1
    assert events[-2].delta.stop_reason == "max_tokens"


def test_forced_tool_use_then_its_result(client: anthropic.Anthropic):
    asked = [{"role": "user", "content": "Weather in Paris"}]
    message = client.messages.create(
        model="echo",
        max_tokens=64,
        tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather"},
        messages=asked,
    )
    assert message.stop_reason == "tool_use"
    (call,) = message.content
    assert call.type == "tool_use" and call.name == "get_weather" and call.id.startswith("toolu_")
    assert isinstance(call.input, dict) and "city" in call.input
    answered = client.messages.create(
        model="echo",
        max_tokens=64,
        tools=[WEATHER],
        messages=[
            *asked,
            {"role": "assistant", "content": message.content},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "sunny"}],
            },
        ],
    )
    assert answered.stop_reason == "end_turn" and answered.content[0].type == "text"


def test_streamed_tool_use(client: anthropic.Anthropic):
    with client.messages.stream(
        model="echo",
        max_tokens=64,
        tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather"},
        messages=[{"role": "user", "content": "Weather in Oslo"}],
    ) as stream:
        final = stream.get_final_message()
    (call,) = final.content
    assert call.type == "tool_use" and call.input == {"city": "Weather in Oslo"}
    assert final.stop_reason == "tool_use"


def test_count_tokens(client: anthropic.Anthropic):
    messages = [{"role": "user", "content": "How many tokens is this?"}]
    plain = client.messages.count_tokens(model="echo", messages=messages)
    with_tools = client.messages.count_tokens(
        model="echo", messages=messages, tools=[WEATHER], system="Be brief."
    )
    assert 0 < plain.input_tokens < with_tools.input_tokens


def test_models_list(client: anthropic.Anthropic):
    listed = client.models.list()
    assert "echo" in [model.id for model in listed.data]


def test_a_400_is_the_sdks_bad_request_error(client: anthropic.Anthropic):
    with pytest.raises(anthropic.BadRequestError) as raised:
        client.messages.create(
            model="echo", max_tokens=16, messages=[{"role": "user", "content": [{"type": "nonsense"}]}]
        )
    assert raised.value.status_code == 400
    assert raised.value.body["error"]["type"] == "invalid_request_error"
    assert raised.value.body["error"]["message"].startswith("messages.0.content.0.type:")
    assert raised.value.request_id


def test_a_401_is_the_sdks_authentication_error(base_url: str):
    stranger = anthropic.Anthropic(base_url=base_url, api_key="cg-not-a-key", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as raised:
        stranger.messages.create(model="echo", max_tokens=16, messages=[{"role": "user", "content": "Hi"}])
    assert raised.value.body["error"]["type"] == "authentication_error"


def test_the_key_in_x_api_key_as_claude_code_sends_it(base_url: str):
    """Claude Code sends `x-api-key` (the SDKs, a Bearer token); `?beta=true` on the path."""
    answer = httpx.post(
        f"{base_url}/v1/messages?beta=true",
        headers={
            "x-api-key": KEY,
            "anthropic-version": "2023-06-01",
            "anthropic-beta": "claude-code-20250219",
        },
        json={"model": "claude-opus-5-5", "max_tokens": 32, "messages": [{"role": "user", "content": "Hi"}]},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["content"][0]["text"] == f"{PREFIX}Hi"


# ----- in front of llama.cpp's real server ----------------------------------------------------


@pytest.fixture(scope="module")
def llama(llama_cpp_upstream: Upstream) -> anthropic.Anthropic:  # noqa: F811
    return anthropic.Anthropic(
        base_url=f"{llama_cpp_upstream.gateway}/anthropic", api_key="unused", max_retries=0
    )


def test_llama_cpp_create_and_stream(llama: anthropic.Anthropic, llama_cpp_upstream: Upstream):  # noqa: F811
    asked = [{"role": "user", "content": "Tell me about the river."}]
    message = llama.messages.create(model=DEPLOYMENT, max_tokens=8, extra_body=GREEDY, messages=asked)
    direct = llama_cpp_upstream.direct({"messages": asked, "temperature": 0, "max_tokens": 8})
    text = message.content[0].text if message.content else ""
    assert text == direct["choices"][0]["message"]["content"]
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert message.usage.output_tokens == direct["usage"]["completion_tokens"]
    with llama.messages.stream(model=DEPLOYMENT, max_tokens=8, extra_body=GREEDY, messages=asked) as stream:
        streamed = "".join(stream.text_stream)
    assert streamed == text


def test_llama_cpp_refuses_a_forced_tool_use_it_would_ignore(llama: anthropic.Anthropic):
    """llama.cpp's own server answers text to a forced tool call; the deployment's probe found the
    tools ignored, so the gateway says so (422) instead of passing text off as the call. The
    forced call, its result and the next turn run against vLLM: tests/system/test_fleet_servers.py."""
    with pytest.raises(anthropic.UnprocessableEntityError, match="tools"):
        llama.messages.create(
            model=DEPLOYMENT,
            max_tokens=24,
            extra_body=GREEDY,
            tools=[WEATHER],
            tool_choice={"type": "tool", "name": "get_weather"},
            messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        )
