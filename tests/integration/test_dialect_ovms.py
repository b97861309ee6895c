"""The OpenVINO Model Server dialect at /v3, driven by the openai SDK with OVMS's own parameters."""

from __future__ import annotations

import httpx
import pytest
from openai import BadRequestError, OpenAI

from backends.echo import PREFIX

MESSAGES = [{"role": "user", "content": "What is OpenVINO?"}]
OVMS_PARAMETERS = {"top_k": 40, "repetition_penalty": 1.1, "ignore_eos": False, "length_penalty": 1.0}


@pytest.fixture(scope="module")
def client(gateway_url: str) -> OpenAI:
    return OpenAI(base_url=f"{gateway_url}/v3", api_key="unused", max_retries=0)


def test_create_with_ovms_parameters(client: OpenAI):
    completion = client.chat.completions.create(model="echo", messages=MESSAGES, extra_body=OVMS_PARAMETERS)
    assert completion.choices[0].message.content == f"{PREFIX} What is OpenVINO?"
    assert completion.choices[0].finish_reason == "stop"


def test_stream_with_ovms_parameters(client: OpenAI):
    chunks = list(
        client.chat.completions.create(
            model="echo",
            messages=MESSAGES,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={**OVMS_PARAMETERS, "include_stop_str_in_output": True},
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).endswith(
        "What is OpenVINO?"
    )
    assert chunks[-1].usage.completion_tokens > 0


def test_best_of_below_n_is_refused(client: OpenAI):
    with pytest.raises(BadRequestError) as raised:
        client.chat.completions.create(model="echo", messages=MESSAGES, n=3, extra_body={"best_of": 2})
    assert raised.value.response.json()["error"].startswith("n value (3) cannot be greater than best_of (2)")
    assert (
        client.chat.completions.create(model="echo", messages=MESSAGES, n=2, extra_body={"best_of": 2})
        .choices[1]
        .index
        == 1
    )


def test_include_stop_str_false_with_stream_is_refused(gateway_url: str):
    response = httpx.post(
        f"{gateway_url}/v3/chat/completions",
        json={"model": "echo", "messages": MESSAGES, "stream": True, "include_stop_str_in_output": False},
    )
    assert response.status_code == 400
    assert "include_stop_str_in_output" in response.json()["error"]


def test_unsupported_parameter_is_refused(gateway_url: str):
    response = httpx.post(
        f"{gateway_url}/v3/chat/completions",
        json={"model": "echo", "messages": MESSAGES, "logit_bias": {"1": 1}},
    )
    assert response.status_code == 400
    assert "logit_bias" in response.json()["error"]


def test_a_streamed_stop_string_is_kept_and_an_unstreamed_one_cut(client: OpenAI):
    """The seed's default, by the echo backend (TGI and the local backend: their own tests)."""
    whole = client.chat.completions.create(model="echo", messages=MESSAGES, stop=["Open"])
    assert whole.choices[0].message.content == f"{PREFIX} What is "
    stream = client.chat.completions.create(model="echo", messages=MESSAGES, stop=["Open"], stream=True)
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == f"{PREFIX} What is Open"
    explicit = client.chat.completions.create(
        model="echo", messages=MESSAGES, stop=["Open"], extra_body={"include_stop_str_in_output": True}
    )
    assert explicit.choices[0].message.content == f"{PREFIX} What is Open"
