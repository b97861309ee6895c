"""The OpenAI dialect at /v1, driven by the official openai SDK and huggingface_hub."""

from __future__ import annotations

import json

import pytest
from huggingface_hub import InferenceClient
from openai import NotFoundError, OpenAI

from backends.echo import PREFIX

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Tell me about the weather in Paris today"},
]


@pytest.fixture(scope="module")
def client(gateway_url: str) -> OpenAI:
    return OpenAI(base_url=f"{gateway_url}/v1", api_key="unused", max_retries=0)


def test_create_says_it_is_an_echo(client: OpenAI):
    completion = client.chat.completions.create(model="echo", messages=MESSAGES)
    choice = completion.choices[0]
    assert completion.object == "chat.completion"
    assert completion.id.startswith("chatcmpl-")
    assert choice.message.role == "assistant"
    assert choice.message.content == f"{PREFIX} Tell me about the weather in Paris today"
    assert "not a language model" in choice.message.content
    assert choice.finish_reason == "stop"
    assert completion.usage.total_tokens == (
        completion.usage.prompt_tokens + completion.usage.completion_tokens
    )


def test_max_tokens_ends_with_length(client: OpenAI):
    completion = client.chat.completions.create(model="echo", messages=MESSAGES, max_tokens=3)
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage.completion_tokens == 3
    newer = client.chat.completions.create(model="echo", messages=MESSAGES, max_completion_tokens=4)
    assert newer.usage.completion_tokens == 4


def test_stop_sequence_cuts_before_it(client: OpenAI):
    completion = client.chat.completions.create(model="echo", messages=MESSAGES, stop=["Paris"])
    assert completion.choices[0].message.content.endswith("weather in ")
    assert completion.choices[0].finish_reason == "stop"


def test_stream_matches_the_completion(client: OpenAI):
    whole = client.chat.completions.create(model="echo", messages=MESSAGES, seed=7)
    chunks = list(
        client.chat.completions.create(
            model="echo",
            messages=MESSAGES,
            seed=7,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert len({c.id for c in chunks}) == 1
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "stop" and set(finishes[:-1]) == {None}
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == []
    assert usage_chunk.usage.model_dump() == whole.usage.model_dump()


def test_stream_without_include_usage_has_no_usage_chunk(client: OpenAI):
    chunks = list(client.chat.completions.create(model="echo", messages=MESSAGES, stream=True))
    assert all(c.choices for c in chunks)
    assert all(c.usage is None for c in chunks)


def test_n_two_choices(client: OpenAI):
    completion = client.chat.completions.create(model="echo", messages=MESSAGES, n=2)
    assert [c.index for c in completion.choices] == [0, 1]
    assert completion.choices[0].message.content == completion.choices[1].message.content
    single = client.chat.completions.create(model="echo", messages=MESSAGES)
    assert completion.usage.completion_tokens == 2 * single.usage.completion_tokens
    streamed = list(client.chat.completions.create(model="echo", messages=MESSAGES, n=2, stream=True))
    assert {c.choices[0].index for c in streamed} == {0, 1}


def test_logprobs_are_well_formed(client: OpenAI):
    completion = client.chat.completions.create(
        model="echo", messages=MESSAGES, logprobs=True, top_logprobs=3, max_tokens=5
    )
    content = completion.choices[0].logprobs.content
    assert len(content) == 5
    assert "".join(t.token for t in content) == completion.choices[0].message.content
    for token in content:
        assert token.logprob <= 0
        assert bytes(token.bytes).decode() == token.token
        assert len(token.top_logprobs) == 3
        assert token.top_logprobs[0].token == token.token
        values = [t.logprob for t in token.top_logprobs]
        assert values == sorted(values, reverse=True)
    streamed = list(
        client.chat.completions.create(
            model="echo",
            messages=MESSAGES,
            logprobs=True,
            top_logprobs=3,
            max_tokens=5,
            stream=True,
        )
    )
    streamed_tokens = [
        t.token for c in streamed if c.choices[0].logprobs for t in c.choices[0].logprobs.content
    ]
    assert streamed_tokens == [t.token for t in content]


def test_forced_tool_choice_returns_json_arguments(client: OpenAI):
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "city": {"type": "string"},
                        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                        "days": {"type": "integer", "minimum": 1},
                    },
                    "required": ["city"],
                },
            },
        }
    ]
    completion = client.chat.completions.create(
        model="echo",
        messages=MESSAGES,
        tools=tools,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    arguments = json.loads(call.function.arguments)
    assert arguments["unit"] == "celsius" and arguments["days"] == 1
    assert isinstance(arguments["city"], str)
    streamed = list(
        client.chat.completions.create(
            model="echo", messages=MESSAGES, tools=tools, tool_choice="required", stream=True
        )
    )
    calls = [tc for c in streamed if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert calls[0].function.name == "get_weather"
    assert json.loads(calls[0].function.arguments) == arguments
    assert streamed[-1].choices[0].finish_reason == "tool_calls"


def test_json_object_and_json_schema(client: OpenAI):
    completion = client.chat.completions.create(
        model="echo", messages=MESSAGES, response_format={"type": "json_object"}
    )
    assert json.loads(completion.choices[0].message.content)["echo"] == MESSAGES[-1]["content"]
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "string"}, "score": {"type": "number"}},
        "required": ["answer", "score"],
    }
    shaped = client.chat.completions.create(
        model="echo",
        messages=MESSAGES,
        response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
    )
    value = json.loads(shaped.choices[0].message.content)
    assert isinstance(value["answer"], str) and isinstance(value["score"], float)


def test_models(client: OpenAI):
    assert [m.id for m in client.models.list()] == ["echo"]
    assert client.models.retrieve("echo").id == "echo"


def test_usage_is_the_same_streamed_or_not(client: OpenAI):
    kwargs = {"model": "echo", "messages": MESSAGES, "n": 3, "max_tokens": 6, "stop": ["weather"]}
    whole = client.chat.completions.create(**kwargs)
    streamed = list(
        client.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True})
    )
    assert streamed[-1].usage.model_dump() == whole.usage.model_dump()


def test_huggingface_hub_chat_completion(gateway_url: str):
    client = InferenceClient(base_url=f"{gateway_url}/v1")
    output = client.chat_completion(messages=MESSAGES, model="echo", max_tokens=4)
    assert output.choices[0].message.content == " ".join(PREFIX.split()[:4])
    assert output.choices[0].finish_reason == "length"
    streamed = list(client.chat_completion(messages=MESSAGES, model="echo", stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert text.endswith("Tell me about the weather in Paris today")


def test_unknown_model_is_not_an_error_on_the_default_catch_all(client: OpenAI):
    assert client.chat.completions.create(model="anything", messages=MESSAGES).model == "anything"


def test_retrieve_unknown_model_when_there_is_no_catch_all(tmp_path, log_dir):
    from tests.support.servers import running_gateway

    config = tmp_path / "config.yaml"
    config.write_text("deployments:\n  - name: only-this\n    backend: echo\n")
    with running_gateway(log_dir, config) as url:
        strict = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        with pytest.raises(NotFoundError) as raised:
            strict.models.retrieve("gpt-5")
        assert raised.value.body["code"] == "model_not_found"
        with pytest.raises(NotFoundError):
            strict.chat.completions.create(model="gpt-5", messages=MESSAGES)
        assert strict.chat.completions.create(model="only-this", messages=MESSAGES).choices
