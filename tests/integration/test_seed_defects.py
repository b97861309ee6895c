"""The six seed rules issue 26 found unkept, each against a running gateway on the echo backend.

Each test failed on a4f111b: (1) a function without `parameters` called with a JSON string,
(2) audio output asked of a text-only model answered in text, (3) `tool_choice: "required"`
without tools and (4) a named `tool_choice` outside `tools` answered as plain messages,
(5) Azure's `max_tokens: 0` ending with `stop`, (6) `logit_bias` keys that are not token ids
taken on Aleph Alpha and LMI.
"""

from __future__ import annotations

import json

import httpx
import pytest

from tests.support.readers import reader

AZURE = "/azure/chat/completions?api-version=2024-05-01-preview"
CHAT_PATHS = {
    "openai": "/v1/chat/completions",
    "azure": AZURE,
    "ovms": "/v3/chat/completions",
}
USER = [{"role": "user", "content": "What is the weather in Paris?"}]
NO_PARAMETERS_TOOL = {"type": "function", "function": {"name": "get_time", "description": "The time now."}}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def post(url: str, path: str, body: dict, **headers: str) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, headers=headers, timeout=30)


def error_message(response: httpx.Response) -> str:
    return json.dumps(response.json())


@pytest.mark.parametrize("dialect", sorted(CHAT_PATHS))
def test_function_without_parameters_is_called_with_an_empty_object(gateway_url: str, dialect: str):
    body = {"model": "echo", "messages": USER, "tools": [NO_PARAMETERS_TOOL], "tool_choice": "required"}
    if dialect == "ovms":
        body["tool_choice"] = {"type": "function", "function": {"name": "get_time"}}
    response = post(gateway_url, CHAT_PATHS[dialect], body)
    assert response.status_code == 200, response.text
    (name, arguments), *_ = reader(dialect).tool_calls(response.json())
    assert name == "get_time"
    assert json.loads(arguments) == {}


def test_legacy_function_without_parameters_is_called_with_an_empty_object(gateway_url: str):
    body = {
        "model": "echo",
        "messages": USER,
        "functions": [{"name": "get_time"}],
        "function_call": {"name": "get_time"},
    }
    response = post(gateway_url, CHAT_PATHS["openai"], body)
    assert response.status_code == 200, response.text
    call = response.json()["choices"][0]["message"]["function_call"]
    assert json.loads(call["arguments"]) == {}


def test_audio_output_from_a_text_only_model_is_422_naming_modalities(gateway_url: str):
    body = {
        "model": "echo",
        "messages": USER,
        "modalities": ["text", "audio"],
        "audio": {"voice": "alloy", "format": "wav"},
    }
    response = post(gateway_url, CHAT_PATHS["openai"], body)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["param"] == "modalities"
    assert "not supported" in error["message"]
    text_only = post(gateway_url, CHAT_PATHS["openai"], {**body, "modalities": ["text"], "audio": None})
    assert text_only.status_code == 200, text_only.text


def test_audio_modality_without_audio_is_400(gateway_url: str):
    body = {"model": "echo", "messages": USER, "modalities": ["text", "audio"]}
    response = post(gateway_url, CHAT_PATHS["openai"], body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "audio"


@pytest.mark.parametrize("dialect", ["openai", "azure"])
def test_required_tool_choice_without_tools_is_400(gateway_url: str, dialect: str):
    for tools in (None, []):
        body = {"model": "echo", "messages": USER, "tool_choice": "required"}
        if tools is not None:
            body["tools"] = tools
        response = post(gateway_url, CHAT_PATHS[dialect], body)
        assert response.status_code == 400, response.text
        # an empty list is refused by Azure's schema itself (tools: minItems 1)
        assert ("tool_choice" if tools is None else "tool") in error_message(response)


@pytest.mark.parametrize("dialect", sorted(CHAT_PATHS))
def test_named_tool_choice_outside_tools_is_400(gateway_url: str, dialect: str):
    named = {"type": "function", "function": {"name": "get_time"}}
    body = {"model": "echo", "messages": USER, "tools": [WEATHER_TOOL], "tool_choice": named}
    response = post(gateway_url, CHAT_PATHS[dialect], body)
    assert response.status_code == 400, response.text
    assert "get_time" in error_message(response)
    without_tools = post(gateway_url, CHAT_PATHS[dialect], {**body, "tools": None})
    assert without_tools.status_code == 400, without_tools.text
    named_right = {"type": "function", "function": {"name": "get_weather"}}
    fine = post(gateway_url, CHAT_PATHS[dialect], {**body, "tool_choice": named_right})
    assert fine.status_code == 200, fine.text


def test_azure_max_tokens_zero_ends_with_length(gateway_url: str):
    body = {"model": "echo", "messages": USER, "max_tokens": 0}
    response = post(gateway_url, AZURE, body)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] == "length"
    assert not choice["message"]["content"]
    with httpx.stream("POST", f"{gateway_url}{AZURE}", json={**body, "stream": True}, timeout=30) as stream:
        assert stream.status_code == 200
        chunks = [
            json.loads(line[len("data: ") :])
            for line in stream.iter_lines()
            if line.startswith("data: ") and line != "data: [DONE]"
        ]
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c.get("choices")]
    assert finishes[-1] == "length"


@pytest.mark.parametrize(
    "path", ["/v1/chat/completions", "/aleph-alpha/chat/completions", "/lmi/v1/chat/completions"]
)
def test_logit_bias_keys_must_be_token_ids(gateway_url: str, path: str):
    body = {"model": "echo", "messages": USER, "logit_bias": {"hello": 5}}
    response = post(gateway_url, path, body)
    assert response.status_code == 400, response.text
    assert "logit_bias" in error_message(response)
    fine = post(gateway_url, path, {**body, "logit_bias": {"50256": 5}})
    assert fine.status_code == 200, fine.text
