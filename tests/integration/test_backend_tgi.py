"""The tgi backend, end to end: a real gateway process in front of a TGI stand-in
(tests/support/tgi_server.py) that checks every request it receives and every answer it sends against
TGI's own OpenAPI document when the vendor documents are there (tests/conftest.py; without them
the stand-in runs unchecked and only `test_the_stand_in_is_checked_against_tgis_document` is
skipped). Each dialect is driven through its SDK where one fits.

What the stand-in received is part of each check: the mapping from a dialect's parameters to
TGI's is asserted on the wire, not only on the answer.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest
import yaml
from aleph_alpha_client import AsyncClient as AlephAlphaAsyncClient
from aleph_alpha_client import Client as AlephAlphaClient
from aleph_alpha_client.chat import ChatRequest as AlephAlphaChatRequest
from aleph_alpha_client.chat import FinishReason as AlephAlphaFinishReason
from aleph_alpha_client.chat import Message, Role, StreamOptions
from azure.ai.inference import ChatCompletionsClient
from azure.ai.inference.models import ChatCompletionsToolDefinition, FunctionDefinition, UserMessage
from azure.core.credentials import AzureKeyCredential

from backends.tgi.backend import TGIBackend
from backends.tgi.events import ChoiceEvents, StopTrimmer, split_tool_call
from backends.tgi.options import TGIOptions
from backends.tgi.tables import parameter_table
from gateway.config.settings import ConfigError
from tests.support.readers import reader, registered
from tests.support.servers import CHAT_PATHS, free_port, running_gateway
from tests.support.tgi_server import TGIStandIn, chat_template, running_tgi, token_logprob, tokenize

CLIENT_TIMEOUT = 20.0  # every request is bounded: a hang fails the test instead of stalling it
PATHS = CHAT_PATHS
HELLO = [{"role": "user", "content": "hello there friend"}]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
            "required": ["city", "days"],
        },
    },
}
PERSON_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}


def prompt_tokens(messages: list[dict[str, Any]]) -> int:
    """What the stand-in counts for a prompt TGI templated from these messages."""
    return len(tokenize(chat_template(messages)))


# ----- fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tgi(refspecs_dir: Path | None) -> Iterator[TGIStandIn]:
    with running_tgi(refspecs_dir) as stand_in:
        yield stand_in
    assert stand_in.failures == [], "\n".join(stand_in.failures)


@pytest.fixture(scope="module")
def gateway(tgi: TGIStandIn, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    directory = tmp_path_factory.mktemp("tgi-gateway")
    # One try per request and no ejection: each TGI failure reaches the client as the backend maps it.
    one_try = {"retries": {"attempts": 1}, "health": {"failures": 1_000_000}}
    config = {
        "deployments": [
            {
                "name": "tiny",
                "backend": "tgi",
                "models": ["*"],
                "extra_parameters": "pass-through",
                "options": {"url": tgi.url, "timeout": 10, "modalities": ["text", "image"]},
                **one_try,
            },
            {
                "name": "tiny-generate",
                "backend": "tgi",
                "options": {"url": tgi.url, "use_messages_api": False, "timeout": 10},
                **one_try,
            },
            {
                "name": "tiny-slow",
                "backend": "tgi",
                "options": {"url": tgi.url, "timeout": 0.5},
                **one_try,
            },
            {
                "name": "tiny-down",
                "backend": "tgi",
                "options": {"url": f"http://127.0.0.1:{free_port()}", "timeout": 5},
                **one_try,
            },
        ]
    }
    path = directory / "chatgate.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    with running_gateway(directory, path) as url:
        yield url


@pytest.fixture(autouse=True)
def checked(request: pytest.FixtureRequest) -> Iterator[None]:
    """Start each test with no recorded requests; end it with no refspec mismatch."""
    if "tgi" not in request.fixturenames:
        yield
        return
    stand_in: TGIStandIn = request.getfixturevalue("tgi")
    stand_in.take_requests()
    stand_in.abandoned.clear()
    yield
    assert stand_in.failures == [], "\n".join(stand_in.failures)


def sent(tgi: TGIStandIn, path: str) -> list[dict[str, Any]]:
    """The bodies the stand-in received on `path` since the test began."""
    return [body for where, body in tgi.requests if where == path]


@pytest.fixture(scope="module")
def openai_client(gateway: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway}/v1", api_key="unused", max_retries=0, timeout=CLIENT_TIMEOUT)


@pytest.fixture(scope="module")
def ovms_client(gateway: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway}/v3", api_key="unused", max_retries=0, timeout=CLIENT_TIMEOUT)


@pytest.fixture(scope="module")
def azure_client(gateway: str) -> ChatCompletionsClient:
    return ChatCompletionsClient(
        endpoint=f"{gateway}/azure",
        credential=AzureKeyCredential("unused"),
        retry_total=0,
        connection_timeout=CLIENT_TIMEOUT,
        read_timeout=CLIENT_TIMEOUT,
    )


# ----- OpenAI (/v1, openai SDK) -----------------------------------------------------------------


def test_openai_completion_maps_parameters_to_the_messages_api(tgi, openai_client):
    messages = [{"role": "system", "content": "Be brief."}, *HELLO]
    completion = openai_client.chat.completions.create(
        model="tiny",
        messages=messages,
        max_tokens=50,
        stop=["friend"],
        seed=11,
        temperature=0.5,
        top_p=1.0,
        frequency_penalty=0.25,
        presence_penalty=0,
        user="someone",
    )
    choice = completion.choices[0]
    assert choice.message.content == "You said: hello there "  # TGI keeps "friend"; it is cut
    assert choice.finish_reason == "stop"
    assert completion.usage.prompt_tokens == prompt_tokens(messages)
    assert completion.usage.completion_tokens == len(tokenize("You said: hello there friend"))
    [body] = sent(tgi, "/v1/chat/completions")
    assert body["messages"] == messages
    assert body["model"] == "tgi"
    assert {k: body[k] for k in ("max_tokens", "stop", "seed", "temperature", "frequency_penalty")} == {
        "max_tokens": 50,
        "stop": ["friend"],
        "seed": 11,
        "temperature": 0.5,
        "frequency_penalty": 0.25,
    }
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    for absent in ("top_p", "presence_penalty", "n", "user", "logit_bias"):
        assert absent not in body, absent


def test_openai_stream_relays_tokens_and_usage(tgi, openai_client):
    stream = openai_client.chat.completions.create(
        model="tiny", messages=HELLO, seed=5, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(pieces) > 5  # token by token, not one buffered block
    assert "".join(pieces) == "You said: hello there friend (seed 5)"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert chunks[-1].choices == []
    assert chunks[-1].usage.prompt_tokens == prompt_tokens(HELLO)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_openai_logprobs_come_from_tgi(tgi, openai_client, stream):
    answer = openai_client.chat.completions.create(
        model="tiny", messages=HELLO, logprobs=True, top_logprobs=3, max_tokens=4, stream=stream
    )
    if stream:
        entries = [e for chunk in answer if chunk.choices and chunk.choices[0].logprobs
                   for e in chunk.choices[0].logprobs.content]  # fmt: skip
        text = "You said: hello"
    else:
        entries = answer.choices[0].logprobs.content
        text = answer.choices[0].message.content
    assert "".join(e.token for e in entries) == text == "You said: hello"
    for entry in entries:
        assert entry.logprob == token_logprob(entry.token)
        assert len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].token == entry.token
    [body] = sent(tgi, "/v1/chat/completions")
    assert body["logprobs"] is True and body["top_logprobs"] == 3


def test_openai_n_runs_parallel_requests_with_offset_seeds(tgi, openai_client):
    completion = openai_client.chat.completions.create(model="tiny", messages=HELLO, n=3, seed=7)
    texts = sorted(c.message.content for c in completion.choices)
    assert texts == [f"You said: hello there friend (seed {s})" for s in (7, 8, 9)]
    bodies = sent(tgi, "/v1/chat/completions")
    assert sorted(b["seed"] for b in bodies) == [7, 8, 9]
    assert all("n" not in b for b in bodies)
    per_choice = len(tokenize("You said: hello there friend (seed 7)")) + 1  # and the EOS
    assert completion.usage.completion_tokens == 3 * per_choice


def test_openai_json_object_and_json_schema_become_a_grammar(tgi, openai_client):
    completion = openai_client.chat.completions.create(
        model="tiny", messages=HELLO, response_format={"type": "json_object"}
    )
    assert isinstance(json.loads(completion.choices[0].message.content), dict)
    response_format = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON_SCHEMA}}
    stream = openai_client.chat.completions.create(
        model="tiny", messages=HELLO, response_format=response_format, stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    jsonschema.validate(json.loads(text), PERSON_SCHEMA)
    first, second = sent(tgi, "/v1/chat/completions")
    assert first["response_format"] == {"type": "json", "value": {"type": "object"}}
    assert second["response_format"] == {"type": "json", "value": PERSON_SCHEMA}


def test_openai_tool_call_whole_and_streamed(tgi, openai_client):
    completion = openai_client.chat.completions.create(
        model="tiny", messages=HELLO, tools=[WEATHER_TOOL], tool_choice="required"
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, WEATHER_TOOL["function"]["parameters"])

    stream = openai_client.chat.completions.create(
        model="tiny",
        messages=HELLO,
        tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        stream=True,
    )
    chunks = list(stream)
    calls = [t for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or []]
    assert [(t.function.name, json.loads(t.function.arguments)) for t in calls] == [
        ("get_weather", arguments)
    ]
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
        "tool_calls"
    ]
    first, second = sent(tgi, "/v1/chat/completions")
    assert first["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The weather in a city.",
                "arguments": WEATHER_TOOL["function"]["parameters"],
            },
        }
    ]
    assert first["tool_choice"] == "required"
    assert second["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}


def test_openai_tool_results_reach_tgi_in_its_message_shape(tgi, openai_client):
    history = [
        *HELLO,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": '{"city": "Lisbon", "days": 2}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "developer",
         "content": [{"type": "text", "text": "Answer "}, {"type": "text", "text": "briefly."}]},
        {"role": "user", "content": "thanks"},
    ]  # fmt: skip
    completion = openai_client.chat.completions.create(
        model="tiny", messages=history, tools=[WEATHER_TOOL], tool_choice="auto"
    )
    assert completion.choices[0].message.content == "You said: thanks"  # auto: no tool named
    assert completion.choices[0].finish_reason == "stop"
    [body] = sent(tgi, "/v1/chat/completions")
    assistant, tool, developer = body["messages"][1:4]
    assert assistant == {
        "role": "assistant",
        "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": {"city": "Lisbon", "days": 2}}}
        ],
    }  # fmt: skip
    assert tool == {"role": "tool", "content": "sunny", "tool_call_id": "call_1"}
    assert developer == {"role": "system", "content": "Answer briefly."}


def test_openai_extra_top_k_is_served_by_the_generate_api(tgi, openai_client):
    plain = openai_client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=3)
    tgi.take_requests()
    completion = openai_client.chat.completions.create(
        model="tiny", messages=HELLO, max_tokens=3, temperature=0, extra_body={"top_k": 5}
    )
    assert completion.choices[0].message.content == plain.choices[0].message.content == "You said:"
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage.prompt_tokens == plain.usage.prompt_tokens  # no second BOS
    [templated] = sent(tgi, "/chat_tokenize")
    assert templated["messages"] == HELLO
    [body] = sent(tgi, "/")
    assert body["stream"] is True
    assert body["inputs"] == chat_template(HELLO).removeprefix("<s>")
    assert body["parameters"] == {"details": True, "do_sample": False, "max_new_tokens": 3, "top_k": 5}
    assert sent(tgi, "/v1/chat/completions") == []


def test_openai_json_schema_on_the_generate_api_is_a_grammar(tgi, openai_client):
    response_format = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON_SCHEMA}}
    completion = openai_client.chat.completions.create(
        model="tiny", messages=HELLO, response_format=response_format, extra_body={"top_k": 2}
    )
    jsonschema.validate(json.loads(completion.choices[0].message.content), PERSON_SCHEMA)
    [body] = sent(tgi, "/")
    assert body["parameters"]["grammar"] == {"type": "json", "value": PERSON_SCHEMA}


def test_openai_image_parts_reach_tgi_as_image_url_chunks(tgi, openai_client):
    image = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png", "detail": "low"}}
    messages = [{"role": "user", "content": [{"type": "text", "text": "what is this?"}, image]}]
    completion = openai_client.chat.completions.create(model="tiny", messages=messages)
    assert completion.choices[0].message.content == "You said: what is this?"
    [body] = sent(tgi, "/v1/chat/completions")
    assert body["messages"][0]["content"] == [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
    ]


def test_openai_tools_with_a_generate_only_knob_are_refused(tgi, gateway):
    body = {"model": "tiny", "messages": HELLO, "tools": [WEATHER_TOOL], "top_k": 3}
    response = httpx.post(gateway + PATHS["openai"], json=body, timeout=CLIENT_TIMEOUT)
    assert response.status_code == 422
    assert response.json()["error"]["param"] == "top_k"
    assert tgi.requests == []


# ----- Azure (/azure, azure-ai-inference) -------------------------------------------------------


def test_azure_completion_stream_and_tools(tgi, azure_client):
    completion = azure_client.complete(
        messages=[UserMessage("hello there friend")], model="tiny", max_tokens=3
    )
    assert completion.choices[0].message.content == "You said:"
    assert completion.choices[0].finish_reason == "length"
    updates = list(azure_client.complete(messages=[UserMessage("hello there")], model="tiny", stream=True))
    assert "".join(u.choices[0].delta.content or "" for u in updates if u.choices) == "You said: hello there"
    assert [u.choices[0].finish_reason for u in updates if u.choices and u.choices[0].finish_reason] == [
        "stop"
    ]
    tool = ChatCompletionsToolDefinition(
        function=FunctionDefinition(name="get_weather", parameters=WEATHER_TOOL["function"]["parameters"])
    )
    called = azure_client.complete(
        messages=[UserMessage("get_weather for Lisbon")], model="tiny", tools=[tool], tool_choice="auto"
    )
    [call] = called.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    assert called.choices[0].finish_reason == "tool_calls"
    assert len(sent(tgi, "/v1/chat/completions")) == 3


# ----- Aleph Alpha (/aleph-alpha, aleph-alpha-client) -------------------------------------------


def test_aleph_alpha_chat_and_stream(tgi, gateway):
    client = AlephAlphaClient(token="unused", host=f"{gateway}/aleph-alpha", total_retries=0)
    request = AlephAlphaChatRequest(
        model="tiny", messages=[Message(role=Role.User, content="hello there friend")], top_p=0.9
    )
    response = client.chat(request, model="tiny")
    assert response.message.content == "You said: hello there friend"
    assert response.finish_reason == AlephAlphaFinishReason.Stop

    async def streamed() -> list[Any]:
        async with AlephAlphaAsyncClient(
            token="unused", host=f"{gateway}/aleph-alpha", total_retries=0
        ) as aa:
            request = AlephAlphaChatRequest(
                model="tiny",
                messages=[Message(role=Role.User, content="hello there")],
                stream_options=StreamOptions(include_usage=True),
            )
            return [item async for item in aa.chat_with_streaming(request, model="tiny")]

    items = asyncio.run(streamed())
    text = "".join(item.content for item in items if hasattr(item, "content"))
    assert text == "You said: hello there"
    assert AlephAlphaFinishReason.Stop in items
    assert [b.get("top_p") for b in sent(tgi, "/v1/chat/completions")] == [0.9, None]


def test_aleph_alpha_logprobs(tgi, gateway):
    body = {"model": "tiny", "messages": HELLO, "logprobs": True, "top_logprobs": 2, "max_tokens": 3}
    answer = httpx.post(gateway + PATHS["aleph_alpha"], json=body, timeout=CLIENT_TIMEOUT).json()
    content = answer["choices"][0]["logprobs"]["content"]
    assert [e["token"] for e in content] == ["You", " said", ":"]
    assert all(len(e["top_logprobs"]) == 2 and e["logprob"] == token_logprob(e["token"]) for e in content)


# ----- DJL LMI (/lmi, JSON lines over httpx) ----------------------------------------------------


@pytest.mark.parametrize("deployment", ["tiny", "tiny-generate"], ids=["messages-api", "generate-api"])
@pytest.mark.parametrize(
    ("extra", "text", "finish_reason"),
    [
        ({}, "You said: hello there friend", "eos_token"),
        ({"stop": ["there"]}, "You said: hello ", "stop_sequence"),
        ({"max_tokens": 2}, "You said", "length"),
    ],
    ids=["eos", "stop-sequence", "length"],
)
def test_lmi_keeps_eos_and_stop_sequence_apart(tgi, gateway, deployment, extra, text, finish_reason):
    body = {"model": deployment, "messages": HELLO, **extra}
    answer = httpx.post(gateway + PATHS["lmi"], json=body, timeout=CLIENT_TIMEOUT).json()
    assert answer["choices"][0]["message"]["content"] == text
    assert answer["choices"][0]["finish_reason"] == finish_reason
    with httpx.stream(
        "POST", gateway + PATHS["lmi"], json={**body, "stream": True}, timeout=CLIENT_TIMEOUT
    ) as r:
        assert r.headers["content-type"].startswith("application/jsonlines")
        lines = [json.loads(line) for line in r.iter_lines() if line]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in lines if c["choices"]) == text
    assert [
        c["choices"][0]["finish_reason"] for c in lines if c["choices"] and c["choices"][0]["finish_reason"]
    ] == [finish_reason]
    route = "/" if deployment == "tiny-generate" else "/v1/chat/completions"
    assert len(sent(tgi, route)) == 2


def test_lmi_logprobs_from_tgi_details(tgi, gateway):
    body = {"model": "tiny-generate", "messages": HELLO, "logprobs": True, "top_logprobs": 2, "max_tokens": 3}
    answer = httpx.post(gateway + PATHS["lmi"], json=body, timeout=CLIENT_TIMEOUT).json()
    content = answer["choices"][0]["logprobs"]["content"]
    assert [e["token"] for e in content] == ["You", " said", ":"]
    assert all(e["logprob"] == token_logprob(e["token"]) and len(e["top_logprobs"]) == 2 for e in content)
    [generate] = sent(tgi, "/")
    assert generate["parameters"]["top_n_tokens"] == 2 and generate["parameters"]["details"] is True


# ----- OpenVINO Model Server (/v3, openai SDK) --------------------------------------------------


def test_ovms_top_k_and_repetition_penalty_use_the_generate_api(tgi, ovms_client):
    completion = ovms_client.chat.completions.create(
        model="tiny",
        messages=HELLO,
        stop=["friend"],
        extra_body={"top_k": 4, "repetition_penalty": 1.1, "include_stop_str_in_output": True},
    )
    assert completion.choices[0].message.content == "You said: hello there friend"  # kept, as asked
    [body] = sent(tgi, "/")
    assert body["parameters"]["top_k"] == 4 and body["parameters"]["repetition_penalty"] == 1.1
    assert body["parameters"]["stop"] == ["friend"]
    stream = ovms_client.chat.completions.create(
        model="tiny", messages=HELLO, stream=True, extra_body={"top_k": 4, "typical_p": 1.0}
    )
    assert (
        "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        == "You said: hello there friend"
    )
    assert "typical_p" not in sent(tgi, "/")[-1]["parameters"]  # 1.0 means off


@pytest.mark.parametrize("deployment", ["tiny", "tiny-generate"], ids=["messages-api", "generate-api"])
def test_ovms_keeps_a_streamed_stop_string_and_cuts_an_unstreamed_one(tgi, ovms_client, deployment):
    """The seed: a matched stop string is left out of a whole answer and kept in a stream."""
    whole = ovms_client.chat.completions.create(model=deployment, messages=HELLO, stop=["there"])
    assert whole.choices[0].message.content == "You said: hello "
    chunks = list(
        ovms_client.chat.completions.create(model=deployment, messages=HELLO, stop=["there"], stream=True)
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "You said: hello there"
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert reasons == ["stop"]


def test_ovms_logprobs(tgi, ovms_client):
    completion = ovms_client.chat.completions.create(
        model="tiny", messages=HELLO, logprobs=True, max_tokens=2
    )
    entries = completion.choices[0].logprobs.content  # OVMS: the chosen token's logprob only
    assert [(e.token, e.logprob, e.top_logprobs) for e in entries] == [
        (t, token_logprob(t), []) for t in ("You", " said")
    ]


# ----- errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize("dialect", registered())
@pytest.mark.parametrize(("tgi_status", "status"), [(422, 422), (424, 502), (429, 429)])
def test_tgi_errors_reach_each_dialect_in_its_shape(tgi, gateway, dialect, tgi_status, status):
    body = reader(dialect).body(f"please tgi:fail={tgi_status}", "tiny")
    response = httpx.post(gateway + PATHS[dialect], json=body, timeout=CLIENT_TIMEOUT)
    assert response.status_code == status
    assert reader(dialect).error_shaped(response.json(), status, response.headers), response.json()
    if status == 429:
        assert int(response.headers["retry-after"]) >= 1
    if status == 422 and dialect == "openai":
        assert response.json()["error"]["param"] == "temperature"  # named by TGI's message
    if status == 422 and dialect == "azure":
        assert response.json()["detail"]["loc"] == ["body", "temperature"]


@pytest.mark.parametrize("deployment", ["tiny", "tiny-generate"])
def test_openai_sdk_sees_tgi_errors(tgi, openai_client, deployment):
    with pytest.raises(openai.RateLimitError) as overloaded:
        openai_client.chat.completions.create(
            model=deployment, messages=[{"role": "user", "content": "tgi:fail=429"}]
        )
    assert overloaded.value.response.headers["retry-after"] == "1"
    with pytest.raises(openai.InternalServerError) as failed:
        openai_client.chat.completions.create(
            model=deployment, messages=[{"role": "user", "content": "tgi:fail=424"}]
        )
    assert failed.value.status_code == 502
    with pytest.raises(openai.APIStatusError) as unavailable:
        openai_client.chat.completions.create(
            model=deployment, messages=[{"role": "user", "content": "tgi:fail=503"}]
        )
    assert unavailable.value.status_code == 503


def test_unreachable_tgi_is_503_and_a_slow_one_504(tgi, openai_client):
    with pytest.raises(openai.APIStatusError) as down:
        openai_client.chat.completions.create(model="tiny-down", messages=HELLO)
    assert down.value.status_code == 503
    with pytest.raises(openai.APIStatusError) as slow:
        openai_client.chat.completions.create(
            model="tiny-slow", messages=[{"role": "user", "content": "tgi:sleep=3"}]
        )
    assert slow.value.status_code == 504


@pytest.mark.parametrize("deployment", ["tiny", "tiny-generate"])
def test_dropped_connection_mid_stream_ends_with_an_error_event(tgi, openai_client, gateway, deployment):
    messages = [{"role": "user", "content": "hello tgi:drop=3"}]
    stream = openai_client.chat.completions.create(model=deployment, messages=messages, stream=True)
    chunks = []
    with pytest.raises(openai.APIError, match="connection to TGI broke"):
        for chunk in stream:
            chunks.append(chunk)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "You said:"
    assert all(c.choices[0].finish_reason is None for c in chunks if c.choices)  # none invented

    body = {"model": deployment, "messages": messages, "stream": True}
    with httpx.stream("POST", gateway + PATHS["lmi"], json=body, timeout=CLIENT_TIMEOUT) as response:
        assert response.status_code == 200
        lines = [json.loads(line) for line in response.iter_lines() if line]
    assert lines[-1] == {"code": 502, "type": "BadGatewayException", "message": lines[-1]["message"]}
    assert all(line["choices"][0]["finish_reason"] is None for line in lines[:-1])


def test_errors_before_and_during_a_stream(tgi, gateway, openai_client):
    early = {"model": "tiny", "messages": [{"role": "user", "content": "tgi:drop=0"}], "stream": True}
    response = httpx.post(gateway + PATHS["openai"], json=early, timeout=CLIENT_TIMEOUT)
    assert response.status_code == 502  # nothing was sent yet: a plain HTTP error
    late = [{"role": "user", "content": "hello tgi:event=424@2"}]
    with pytest.raises(openai.APIError, match="during generation"):
        list(openai_client.chat.completions.create(model="tiny", messages=late, stream=True))


@pytest.mark.parametrize("deployment", ["tiny", "tiny-generate"])
def test_a_stream_that_ends_without_a_finish_is_an_error_not_a_finish(tgi, openai_client, deployment):
    messages = [{"role": "user", "content": "hello tgi:cut=2"}]
    stream = openai_client.chat.completions.create(model=deployment, messages=messages, stream=True)
    chunks = []
    with pytest.raises(openai.APIError, match="before the generation finished"):
        for chunk in stream:
            chunks.append(chunk)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "You said"
    assert all(c.choices[0].finish_reason is None for c in chunks if c.choices)


@pytest.mark.parametrize("deployment", ["tiny", "tiny-generate"])
def test_a_client_that_goes_away_closes_the_upstream_stream(tgi, gateway, deployment):
    body = {"model": deployment, "messages": [{"role": "user", "content": "hi tgi:pace=0.2"}], "stream": True}
    with httpx.stream("POST", gateway + PATHS["openai"], json=body, timeout=CLIENT_TIMEOUT) as response:
        first = next(response.iter_lines())
        assert first.startswith("data: ")
    # the gateway notices the disconnect and closes its stream to TGI before the paced tokens end
    for _ in range(100):
        if tgi.abandoned:
            break
        time.sleep(0.05)
    assert tgi.abandoned == ["/generate_stream" if deployment == "tiny-generate" else "/v1/chat/completions"]
    tgi.abandoned.clear()


def test_a_done_line_without_space_still_ends_the_stream(tgi, openai_client):
    messages = [{"role": "user", "content": "hi tgi:done=nospace"}]
    stream = openai_client.chat.completions.create(model="tiny", messages=messages, stream=True)
    chunks = list(stream)
    assert (
        "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        == "You said: hi tgi:done=nospace"
    )


def test_parameter_table_follows_the_route_choice(tgi, gateway):
    tools = {"model": "tiny-generate", "messages": HELLO, "tools": [WEATHER_TOOL]}
    response = httpx.post(gateway + PATHS["openai"], json=tools, timeout=CLIENT_TIMEOUT)
    assert response.status_code == 422 and response.json()["error"]["param"] == "tools"
    penalty = {"model": "tiny", "messages": HELLO, "presence_penalty": 0.5}
    response = httpx.post(gateway + PATHS["openai"], json=penalty, timeout=CLIENT_TIMEOUT)
    assert response.status_code == 422 and response.json()["error"]["param"] == "presence_penalty"
    assert tgi.requests == []


# ----- units: the pieces that need no server ----------------------------------------------------


@pytest.mark.parametrize(
    ("stops", "tokens", "stopped", "expected"),
    [
        ([], ["a", " b"], False, ["a", " b"]),
        (["end"], ["x", " e", "n", "d"], True, ["x", " "]),  # the match spans three tokens
        (["end"], ["x", " e", "n", "!"], False, ["x", " e", "n", "!"]),  # a false start is released
        (["."], ["Hi", " there."], True, ["Hi", " there"]),  # the token holding the stop is cut
        (["ab", "b"], ["x", "a", "b"], True, ["x"]),  # the longest match is cut
    ],
)
def test_stop_trimmer(stops, tokens, stopped, expected):
    trimmer = StopTrimmer(stops)
    released = [piece for token in tokens for piece in trimmer.push((token, None))]
    released += trimmer.finish(cut_stop=stopped)
    assert [text for text, _ in released if text] == expected


def test_a_stop_string_reported_as_stop_is_still_cut():
    from gateway.core.canonical import ChatRequest, Finish, TextDelta

    events = ChoiceEvents(0, ChatRequest(model="m", messages=HELLO, stop=["\n\n"]))
    out = [e for token in ("Hi", " you", "\n", "\n") for e in events.text(token, None)]
    out += events.finish("stop")  # what TGI 2.x's Messages API said for any stop
    assert [e.text for e in out if isinstance(e, TextDelta)] == ["Hi", " you"]
    assert out[-1] == Finish(0, "stop_sequence", "\n\n")  # which one, named


def test_a_kept_stop_string_is_passed_on_at_once_and_still_named():
    from gateway.core.canonical import ChatRequest, Finish, TextDelta

    kept = {"include_stop_str_in_output": True}
    request = ChatRequest(model="m", messages=HELLO, stop=["END"], options=kept)
    events = ChoiceEvents(0, request)
    out = [e for token in ("Hi", " E", "N", "D") for e in events.text(token, None)]
    assert [e.text for e in out if isinstance(e, TextDelta)] == ["Hi", " E", "N", "D"]  # nothing held
    assert events.finish("stop")[-1] == Finish(0, "stop_sequence", "END")


def test_stop_trimmer_releases_text_that_cannot_start_a_stop_at_once():
    trimmer = StopTrimmer(["STOP"])
    assert trimmer.push(("hello", None)) == [("hello", None)]
    assert trimmer.push((" S", None)) == []
    assert trimmer.push(("x", None)) == [(" S", None), ("x", None)]


@pytest.mark.parametrize(
    ("name", "arguments", "expected"),
    [
        ("f", '{ "a": 1}', ("f", '{ "a": 1}')),  # TGI 3.x: `{` plus fragments
        (None, '{"function": {"_name": "f", "a": 1}}', ("f", '{"a":1}')),  # TGI 2.x raw grammar
        ("f", '{"a": 1}}', ("f", '{"a": 1}')),  # one closing brace too many
    ],
)
def test_split_tool_call(name, arguments, expected):
    assert split_tool_call(name, arguments) == expected


def test_a_tool_call_that_tgi_finishes_with_stop_reports_tool_calls():
    from gateway.core.canonical import ChatRequest, Finish, ToolCallDelta

    events = ChoiceEvents(0, ChatRequest(model="m", messages=HELLO))
    events.tool_fragment("0", "get_weather", "{")
    events.tool_fragment(None, None, '"city": "Lisbon"}')
    call, finish = events.finish("stop")
    assert isinstance(call, ToolCallDelta) and call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Lisbon"} and call.id.startswith("call_")
    assert finish == Finish(0, "tool_calls")
    assert events.end_of_stream() == []


def test_bad_options_fail_at_start_naming_the_key():
    with pytest.raises(ConfigError, match="tokn"):
        TGIBackend(model="m", url="http://tgi:80", tokn="x")
    with pytest.raises(ConfigError, match="url"):
        TGIBackend(model="m", url="tgi:80")


def test_parameter_tables_by_mode():
    both = parameter_table(TGIOptions(url="http://tgi"))
    assert both["tools"].supported and both["top_k"].supported
    assert not both["logit_bias"].supported
    messages_only = parameter_table(TGIOptions(url="http://tgi", use_messages_api=True))
    assert messages_only["tools"].supported and not messages_only["top_k"].supported
    generate_only = parameter_table(TGIOptions(url="http://tgi", use_messages_api=False, max_top_n_tokens=10))
    assert not generate_only["tools"].supported and generate_only["repetition_penalty"].supported
    assert generate_only["top_logprobs"].maximum == 10


def test_the_stand_in_is_checked_against_tgis_document(tgi: TGIStandIn, refspecs: Path):
    """With TGI's document at hand the stand-in is checked, and the check is not vacuous: a chunk
    with a bad field fails it, and a mismatch in what it sends is recorded as a failure (which
    the `checked` fixture turns into a failed test)."""
    spec = tgi.spec
    assert spec is not None, f"the stand-in runs unchecked although {refspecs} is there"
    choice = {"index": 0, "delta": {"role": "assistant", "content": "x"}, "finish_reason": None}
    good = {
        "id": "",
        "created": 1,
        "model": "m",
        "system_fingerprint": "f",
        "usage": None,
        "choices": [choice],
    }
    assert spec.errors("ChatCompletionChunk", good) == []
    bad = {**good, "choices": [{"index": -1, "delta": {"role": "assistant"}, "finish_reason": 3}]}
    assert len(spec.errors("ChatCompletionChunk", bad)) >= 2
    assert spec.errors("StreamResponse", {"index": 1, "token": {"id": 1, "text": "a", "special": False}})
    tgi.check("a test's event", "ChatCompletionChunk", bad)
    recorded, tgi.failures[:] = list(tgi.failures), []
    assert recorded and all("does not match ChatCompletionChunk" in f for f in recorded), recorded
