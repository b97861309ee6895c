"""The DJL LMI / SageMaker dialect at /lmi: JSON-lines streams read with httpx."""

from __future__ import annotations

import json

import httpx
import pytest

from backends.echo import PREFIX

MESSAGES = [{"role": "user", "content": "What is deep learning?"}]


def json_lines(response: httpx.Response) -> list[dict]:
    assert response.headers["content-type"].startswith("application/jsonlines")
    return [json.loads(line) for line in response.iter_lines() if line.strip()]


@pytest.mark.parametrize("path", ["/lmi/v1/chat/completions", "/lmi/invocations"])
def test_stream_is_json_lines(gateway_url: str, path: str):
    body = {"messages": MESSAGES, "stream": True, "max_tokens": 4, "logprobs": True, "top_logprobs": 2}
    with httpx.stream("POST", f"{gateway_url}{path}", json=body) as response:
        assert response.status_code == 200
        chunks = json_lines(response)
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == " ".join(PREFIX.split()[:4])
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    first_logprobs = chunks[0]["choices"][0]["logprobs"]
    assert isinstance(first_logprobs, list) and len(first_logprobs[0]["content"][0]["top_logprobs"]) == 2


@pytest.mark.parametrize(
    ("extra", "finish_reason"),
    [({}, "eos_token"), ({"stop": ["deep"]}, "stop_sequence"), ({"max_tokens": 2}, "length")],
)
def test_finish_reasons(gateway_url: str, extra: dict, finish_reason: str):
    response = httpx.post(f"{gateway_url}/lmi/invocations", json={"messages": MESSAGES, **extra})
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["finish_reason"] == finish_reason
    assert set(body["usage"]) == {"prompt_tokens", "completion_tokens", "total_tokens"}


def test_invocations_without_messages_is_a_clear_400(gateway_url: str):
    response = httpx.post(f"{gateway_url}/lmi/invocations", json={"inputs": "hello"})
    assert response.status_code == 400
    body = response.json()
    assert body["code"] == 400 and "messages" in body["message"]


def test_ping(gateway_url: str):
    response = httpx.get(f"{gateway_url}/lmi/ping")
    assert response.status_code == 200 and response.json() == {"status": "Healthy"}
