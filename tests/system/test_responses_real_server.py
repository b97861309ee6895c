"""OpenAI's Responses API in front of llama.cpp's real server (the tiny model of
tests/support/tiny_model.py): the official openai SDK's `responses.create`, `responses.stream`
with its accumulator, and a forced function call refused (llama-server ignores tools),
through a real `chatgate serve` whose deployment is openai-compatible. The model's words are its
own (a tiny random model): each answer is held to what llama.cpp itself answers to the same chat
request, and to the shapes and usage the SDK reads."""

from __future__ import annotations

import pytest
from openai import OpenAI, UnprocessableEntityError

from tests.support.real_server_fixtures import (  # noqa: F401  (fixtures)
    Upstream,
    llama_cpp_upstream,
    model_dir,
)

pytestmark = pytest.mark.slow

PROMPT = "Tell me about the river."
TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    "strict": False,
}


@pytest.fixture(scope="module")
def client(llama_cpp_upstream: Upstream) -> OpenAI:  # noqa: F811
    return OpenAI(base_url=f"{llama_cpp_upstream.gateway}/v1", api_key="unused", max_retries=0)


def direct_text(upstream: Upstream) -> str:
    answer = upstream.direct(
        {"messages": [{"role": "user", "content": PROMPT}], "temperature": 0, "max_tokens": 16}
    )
    return answer["choices"][0]["message"]["content"]


def test_create_answers_what_llama_cpp_answers(client: OpenAI, llama_cpp_upstream: Upstream):  # noqa: F811
    response = client.responses.create(
        model=llama_cpp_upstream.deployment, input=PROMPT, temperature=0, max_output_tokens=16
    )
    assert response.id.startswith("resp_")
    assert response.output_text == direct_text(llama_cpp_upstream)
    assert response.status in ("completed", "incomplete")
    if response.status == "incomplete":
        assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens > 0 and response.usage.input_tokens > 0


def test_stream_accumulates_the_same_text(client: OpenAI, llama_cpp_upstream: Upstream):  # noqa: F811
    with client.responses.stream(
        model=llama_cpp_upstream.deployment, input=PROMPT, temperature=0, max_output_tokens=16
    ) as stream:
        events = list(stream)
    kinds = [event.type for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert "response.output_text.delta" in kinds and "response.output_item.done" in kinds
    # a tiny model seldom ends by itself: cut at max_output_tokens, the stream ends incomplete
    # (the SDK's get_final_response() wants response.completed, so the last event is read)
    last = events[-1]
    assert last.type in ("response.completed", "response.incomplete")
    text = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    assert text == last.response.output_text == direct_text(llama_cpp_upstream)
    if last.type == "response.incomplete":
        assert last.response.incomplete_details.reason == "max_output_tokens"


def test_a_forced_call_llama_cpp_would_ignore_is_refused(client: OpenAI, llama_cpp_upstream: Upstream):  # noqa: F811
    """llama.cpp's own server answers text to a forced call; the deployment's probe found the
    tools ignored, so the gateway answers 422 naming them. The forced call, its output and a
    continuation run against vLLM: tests/system/test_fleet_servers.py."""
    with pytest.raises(UnprocessableEntityError, match="tools"):
        client.responses.create(
            model=llama_cpp_upstream.deployment,
            input="What is the weather in Paris?",
            tools=[TOOL],
            tool_choice={"type": "function", "name": "get_weather"},
            temperature=0,
            max_output_tokens=64,
        )
