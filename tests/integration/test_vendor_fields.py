"""OpenAI's current document (openapi 2.3.0) on /v1, against a running gateway on echo: its
fields are never "extra parameters" (issue 26), the values it added are accepted, custom tools
are named as unsupported (422), and `allowed_tools` is honoured; file parts and custom tool
calls in the history are valid and reach a backend that takes them, or are named (404 / 422).
`extra-parameters: drop` names what it removed in `x-chatgate-dropped-params`."""

from __future__ import annotations

import json

import httpx
import pytest

from backends.base import Capabilities
from backends.echo import EchoBackend
from backends.openai_compatible import CAPABILITIES
from gateway.core.canonical import ChatRequest
from gateway.core.errors import UnprocessableContent
from gateway.policy import capabilities
from tests.support.gateway_process import gateway_process

CHAT = "/v1/chat/completions"
USER = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
TIME = {"type": "function", "function": {"name": "get_time"}}
CURRENT_FIELDS = {
    "verbosity": "high",
    "prompt_cache_key": "cache-1",
    "prompt_cache_retention": "in_memory",
    "prompt_cache_options": {"ttl": "1h"},
    "safety_identifier": "hashed-user",
    "web_search_options": {
        "search_context_size": "high",
        "user_location": {"type": "approximate", "approximate": {"country": "FR", "city": "Paris"}},
    },
    "moderation": {"model": "omni-moderation-latest"},
}


def post(url: str, body: dict, **headers: str) -> httpx.Response:
    return httpx.post(
        f"{url}{CHAT}", json={"model": "echo", "messages": USER, **body}, headers=headers, timeout=30
    )


@pytest.mark.parametrize("name", sorted(CURRENT_FIELDS))
def test_a_current_field_is_no_extra_parameter(gateway_url: str, name: str):
    response = post(gateway_url, {name: CURRENT_FIELDS[name]}, **{"extra-parameters": "error"})
    assert response.status_code == 200, response.text
    # echo shows the extra parameters it got: a defined field is none of them
    assert "extra parameters" not in response.json()["choices"][0]["message"]["content"]


@pytest.mark.parametrize(
    "name, value",
    [("reasoning_effort", v) for v in ("none", "minimal", "xhigh")]
    + [("service_tier", v) for v in ("flex", "priority")],
)
def test_values_the_current_document_added_are_accepted(gateway_url: str, name: str, value: str):
    response = post(gateway_url, {name: value})
    assert response.status_code == 200, response.text


def test_allowed_tools_required_calls_an_allowed_tool(gateway_url: str):
    choice = {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [TIME]}}
    response = post(gateway_url, {"tools": [WEATHER, TIME], "tool_choice": choice})
    assert response.status_code == 200, response.text
    (call,) = response.json()["choices"][0]["message"]["tool_calls"]
    assert call["function"]["name"] == "get_time"
    assert json.loads(call["function"]["arguments"]) == {}
    auto = {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": [TIME]}}
    answered = post(gateway_url, {"tools": [WEATHER, TIME], "tool_choice": auto})
    assert answered.status_code == 200, answered.text
    assert answered.json()["choices"][0]["finish_reason"] == "stop"


def test_custom_tools_are_422_naming_tools(gateway_url: str):
    custom = {"type": "custom", "custom": {"name": "sql", "format": {"type": "text"}}}
    for body in (
        {"tools": [custom]},
        {"tools": [WEATHER, custom], "tool_choice": {"type": "custom", "custom": {"name": "sql"}}},
    ):
        response = post(gateway_url, body)
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert error["param"] == "tools" and "not supported" in error["message"]


def test_drop_names_what_it_removed(gateway_url: str):
    response = post(gateway_url, {"mood": "calm", "colour": "blue"}, **{"extra-parameters": "drop"})
    assert response.status_code == 200, response.text
    assert response.headers["x-chatgate-dropped-params"] == "colour, mood"
    kept = post(gateway_url, {}, **{"extra-parameters": "drop"})
    assert "x-chatgate-dropped-params" not in kept.headers


def test_drop_names_what_it_removed_from_a_stream(gateway_url: str):
    body = {"model": "echo", "messages": USER, "stream": True, "mood": "calm"}
    headers = {"extra-parameters": "drop"}
    with httpx.stream("POST", f"{gateway_url}{CHAT}", json=body, headers=headers, timeout=30) as response:
        assert response.status_code == 200
        assert response.headers["x-chatgate-dropped-params"] == "mood"
        response.read()


def test_dropped_names_cannot_break_the_header(gateway_url: str):
    body = {"evil\r\nx-injected: 1": 1, "café": 2, "x" * 5000: 3}
    response = post(gateway_url, body, **{"extra-parameters": "drop"})
    assert response.status_code == 200, response.text
    assert "x-injected" not in response.headers
    shown = response.headers["x-chatgate-dropped-params"]
    assert shown.isascii() and shown.isprintable() and len(shown) <= 2048
    assert shown.startswith("caf\\xe9, evil\\r\\nx-injected: 1, xxx") and shown.endswith("...")


@pytest.mark.parametrize(
    "path, name, value",
    [
        ("/aleph-alpha/chat/completions", "parallel_tool_calls", True),
        ("/v3/chat/completions", "logit_bias", {"50256": 5}),
    ],
)
def test_an_unsupported_parameter_is_named_as_such(gateway_url: str, path: str, name: str, value):
    """Not the schema's "… is not of types "null", "string" at 'response_format'" (issue 26)."""
    body = {"model": "echo", "messages": USER, name: value}
    response = httpx.post(f"{gateway_url}{path}", json=body, timeout=30)
    assert response.status_code == 400, response.text
    text = response.text
    assert f"The parameter '{name}' is not supported" in text and "is not of type" not in text


def test_integers_are_counted_as_json_schema_2020_12_counts_them(gateway_url: str):
    """OpenAI's document (JSON Schema 2020-12) calls 2.0 an integer: `n: 2.0` is two choices."""
    response = post(gateway_url, {"n": 2.0, "seed": 7.0, "max_completion_tokens": 3.0})
    assert response.status_code == 200, response.text
    answer = response.json()
    assert [c["index"] for c in answer["choices"]] == [0, 1]
    assert answer["usage"]["completion_tokens"] == 6
    assert post(gateway_url, {"n": 2.5}).status_code == 400
    assert post(gateway_url, {"logprobs": True, "top_logprobs": 2.0}).status_code == 200


@pytest.mark.parametrize("voice, format", [("marin", "wav"), ({"id": "voice_1234"}, "aac")])
def test_audio_settings_of_the_current_document_reach_the_model_check(gateway_url: str, voice, format: str):
    """A voice or format only the current document lists is valid: the answer is the model's
    422 for audio output, not a 400 for the setting."""
    body = {"modalities": ["text", "audio"], "audio": {"voice": voice, "format": format}}
    response = post(gateway_url, body)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["param"] == "modalities"


FILE_PART = {"type": "file", "file": {"filename": "report.txt", "file_data": "cmVwb3J0"}}
CUSTOM_CALL = {"id": "call_1", "type": "custom", "custom": {"name": "sql", "input": "SELECT 1"}}


def test_a_file_part_is_taken_by_echo(gateway_url: str):
    """The current document's file part (by data or by id) is valid; echo, which takes every
    part, answers the words beside it."""
    for file in (FILE_PART, {"type": "file", "file": {"file_id": "file-123"}}):
        content = [{"type": "text", "text": "Summarise this."}, file]
        response = post(gateway_url, {"messages": [{"role": "user", "content": content}]})
        assert response.status_code == 200, response.text
        assert (
            response.json()["choices"][0]["message"]["content"].rstrip().endswith("You said: Summarise this.")
        )


def test_a_file_part_to_a_model_without_files_is_404_naming_the_part(tmp_path):
    config = {
        "deployments": [
            {"name": "text-only", "backend": "echo", "capabilities": {"modalities": ["text", "image"]}}
        ]
    }
    messages = [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "hi"},
        {"role": "user", "content": [{"type": "text", "text": "Summarise this."}, FILE_PART]},
    ]
    with gateway_process(tmp_path, config) as gateway:
        response = httpx.post(
            f"{gateway.url}{CHAT}", json={"model": "text-only", "messages": messages}, timeout=30
        )
    assert response.status_code == 404, response.text
    error = response.json()["error"]
    assert error["param"] == "messages[2].content[1]" and "Modality not supported" in error["message"]


def test_a_custom_call_in_the_history_is_taken_by_echo(gateway_url: str):
    messages = [
        {"role": "user", "content": "Count the rows."},
        {"role": "assistant", "content": None, "tool_calls": [CUSTOM_CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "42"},
        {"role": "user", "content": "So how many?"},
    ]
    response = post(gateway_url, {"messages": messages})
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"].endswith("You said: So how many?")


def test_a_custom_call_in_the_history_is_422_where_the_model_has_none():
    """TGI and the local backend carry function calls only: the call is named, not dropped."""
    function_call = {"id": "call_0", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    messages = [
        {"role": "user", "content": "Count the rows."},
        {"role": "assistant", "content": None, "tool_calls": [function_call, CUSTOM_CALL]},
    ]
    request = ChatRequest(model="m", messages=messages)
    with pytest.raises(UnprocessableContent) as refused:
        capabilities.check(request, Capabilities(), prompt_tokens=1)
    assert refused.value.param == "messages[1].tool_calls[1]"
    assert refused.value.loc == ["body", "messages", 1, "tool_calls", 1]
    assert "not supported by this model" in str(refused.value)
    assert EchoBackend.capabilities.custom_calls_in_history and CAPABILITIES.custom_calls_in_history
