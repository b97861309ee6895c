"""OpenAI's Responses API at /v1/responses on the echo backend, driven by the official openai SDK
and plain HTTP: whole and streamed answers, tool calls, structured output, stored responses."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest
from openai import NotFoundError, OpenAI
from pydantic import BaseModel

from backends.echo import PREFIX
from tests.support.servers import ROOT

WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    "strict": False,
}


@pytest.fixture(scope="module")
def client(gateway_url: str) -> OpenAI:
    return OpenAI(base_url=f"{gateway_url}/v1", api_key="unused", max_retries=0)


def test_create_answers_a_response(client: OpenAI):
    response = client.responses.create(model="echo", input="Tell me about Paris", instructions="Be brief.")
    assert response.id.startswith("resp_")
    assert response.object == "response"
    assert response.status == "completed"
    assert response.output_text == f"{PREFIX} Tell me about Paris"
    message = response.output[0]
    assert message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
    assert message.content[0].annotations == []
    assert response.instructions == "Be brief."
    assert response.usage.total_tokens == response.usage.input_tokens + response.usage.output_tokens
    assert response.usage.input_tokens_details.cached_tokens == 0
    assert response.usage.output_tokens_details.reasoning_tokens == 0


def test_max_output_tokens_answers_incomplete(client: OpenAI):
    response = client.responses.create(
        model="echo", input="one two three four five six", max_output_tokens=16
    )
    assert response.status in ("completed", "incomplete")
    short = client.responses.create(model="echo", input=" ".join(["word"] * 40), max_output_tokens=16)
    assert short.status == "incomplete"
    assert short.incomplete_details is not None and short.incomplete_details.reason == "max_output_tokens"
    assert short.usage.output_tokens == 16


def test_stream_runs_the_whole_lifecycle(client: OpenAI):
    with client.responses.stream(model="echo", input=[{"role": "user", "content": "Hello there"}]) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [event.type for event in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert "response.output_text.delta" in kinds
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    numbers = [event.sequence_number for event in events]
    assert numbers == sorted(set(numbers)) and numbers[0] == 0
    assert final.output_text == f"{PREFIX} Hello there"
    done = next(event for event in events if event.type == "response.output_item.done")
    assert done.item.content[0].text == final.output_text  # Codex reads the text only here


def test_raw_stream_names_every_event(gateway_url: str):
    body = {"model": "echo", "input": "Hi", "stream": True, "store": False}
    with httpx.stream("POST", f"{gateway_url}/v1/responses", json=body, timeout=10) as answer:
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/event-stream")
        text = "".join(answer.iter_text())
    frames = [frame for frame in text.split("\n\n") if frame.strip()]
    assert all(frame.startswith("event: ") and "\ndata: " in frame for frame in frames)
    assert frames[-1].startswith("event: response.completed")


def test_function_call_then_its_output(client: OpenAI):
    first = client.responses.create(
        model="echo",
        input="What is the weather in Paris?",
        tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "name": "get_weather"},
    )
    call = next(item for item in first.output if item.type == "function_call")
    assert call.name == "get_weather" and call.id.startswith("fc_") and call.call_id
    second = client.responses.create(
        model="echo",
        input=[
            {"role": "user", "content": "What is the weather in Paris?"},
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": call.name,
                "arguments": call.arguments,
            },
            {"type": "function_call_output", "call_id": call.call_id, "output": "18 degrees"},
        ],
        tools=[WEATHER_TOOL],
    )
    assert second.status == "completed"
    assert second.output_text


def test_parse_into_a_model(client: OpenAI):
    class City(BaseModel):
        city: str
        country: str

    parsed = client.responses.parse(model="echo", input="Paris", text_format=City)
    assert isinstance(parsed.output_parsed, City)


def test_previous_response_id_continues_and_reads_back(client: OpenAI):
    first = client.responses.create(model="echo", input="My name is Ada")
    again = client.responses.retrieve(first.id)
    assert again.id == first.id and again.output_text == first.output_text
    second = client.responses.create(model="echo", input="What is my name?", previous_response_id=first.id)
    assert second.previous_response_id == first.id
    assert second.usage.input_tokens > first.usage.input_tokens  # the history was counted
    items = client.responses.input_items.list(second.id)
    assert [item.type for item in items.data] == ["message"]
    client.responses.delete(first.id)
    with pytest.raises(NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(NotFoundError):
        client.responses.create(model="echo", input="again", previous_response_id=first.id)


def test_store_false_keeps_nothing(client: OpenAI):
    response = client.responses.create(model="echo", input="forget me", store=False)
    with pytest.raises(NotFoundError):
        client.responses.retrieve(response.id)


def test_hosted_tools_are_named_not_offered(gateway_url: str):
    body = {
        "model": "echo",
        "input": [{"type": "message", "role": "developer", "content": "You are Codex."},
                  {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
                  {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "x"}],
        "tools": [WEATHER_TOOL, {"type": "web_search", "external_web_access": False},
                  {"type": "namespace", "name": "multi_agent_v1", "tools": []}],
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "reasoning": {"summary": "auto"},
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "abc",
    }  # fmt: skip
    answer = httpx.post(f"{gateway_url}/v1/responses", json=body, timeout=10)
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-chatgate-dropped-params"] == "tools:namespace, tools:web_search"
    assert answer.json()["reasoning"] == {"effort": None, "summary": None}


def test_errors_are_openai_shaped(gateway_url: str):
    answer = httpx.post(f"{gateway_url}/v1/responses", json={"model": "echo", "input": 3}, timeout=10)
    assert answer.status_code == 400
    assert set(answer.json()["error"]) == {"message", "type", "param", "code"}
    background = httpx.post(
        f"{gateway_url}/v1/responses", json={"model": "echo", "input": "x", "background": True}, timeout=10
    )
    assert background.status_code == 400 and background.json()["error"]["param"] == "background"


def test_chatgate_probe_knows_the_responses_api(gateway_url: str):
    command = [sys.executable, "-m", "gateway", "probe", f"{gateway_url}/v1", "--dialect", "responses"]
    run = subprocess.run(
        [*command, "--model", "echo", "--json"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    found = {feature: finding["verdict"] for feature, finding in report["findings"].items()}
    assert found == {
        "tools": "honoured",
        "json_object": "honoured",
        "json_schema": "honoured",
        "max_tokens": "honoured",
        "stream_done": "honoured",
        "stream_usage": "honoured",
        "error_shape": "honoured",
        "auth": "ignored",  # the default gateway is open
    }
    assert set(report["not_probed"]) == {"n", "logprobs", "stop", "seed"}
