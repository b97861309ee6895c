"""The Azure AI Model Inference dialect at /azure, driven by the official azure-ai-inference SDK."""

from __future__ import annotations

import httpx
import pytest
from azure.ai.inference import ChatCompletionsClient
from azure.ai.inference.models import (
    CompletionsFinishReason,
    ModelType,
    SystemMessage,
    UserMessage,
)
from azure.core.credentials import AzureKeyCredential

from backends.echo import PREFIX

MESSAGES = [SystemMessage("Be brief."), UserMessage("How many moons has Mars?")]
API_VERSION = {"api-version": "2024-05-01-preview"}


@pytest.fixture(scope="module")
def client(gateway_url: str) -> ChatCompletionsClient:
    return ChatCompletionsClient(endpoint=f"{gateway_url}/azure", credential=AzureKeyCredential("unused-key"))


def test_complete(client: ChatCompletionsClient):
    result = client.complete(messages=MESSAGES, max_tokens=100)
    assert result.choices[0].message.content == f"{PREFIX} How many moons has Mars?"
    assert result.choices[0].finish_reason == CompletionsFinishReason.STOPPED
    assert result.usage.total_tokens == result.usage.prompt_tokens + result.usage.completion_tokens
    assert result.model == "echo"


def test_stream(client: ChatCompletionsClient):
    updates = list(client.complete(messages=MESSAGES, stream=True, max_tokens=5))
    text = "".join(u.choices[0].delta.content or "" for u in updates if u.choices)
    assert text == " ".join(f"{PREFIX}".split()[:5])
    assert updates[-1].choices[0].finish_reason == CompletionsFinishReason.TOKEN_LIMIT_REACHED


def test_get_model_info(client: ChatCompletionsClient):
    info = client.get_model_info()
    assert info.model_name == "echo"
    assert info.model_type == ModelType.CHAT_COMPLETION
    assert info.model_provider_name == "chatgate"


def test_model_extras_are_passed_through(client: ChatCompletionsClient):
    # model_extras makes the SDK send `extra-parameters: pass-through`
    result = client.complete(messages=MESSAGES, model_extras={"safe_mode": True})
    assert result.choices[0].message.content.startswith(PREFIX)


def test_extra_parameter_refused_in_azure_shape(gateway_url: str):
    response = httpx.post(
        f"{gateway_url}/azure/chat/completions",
        params=API_VERSION,
        json={"messages": [{"role": "user", "content": "hi"}], "safe_mode": True},
    )
    assert response.status_code == 400
    body = response.json()
    assert body["status"] == 400 and body["param"] == "safe_mode"
    assert "safe_mode" in body["message"]
    assert response.headers["x-ms-error-code"] == body["code"]
    dropped = httpx.post(
        f"{gateway_url}/azure/chat/completions",
        params=API_VERSION,
        headers={"extra-parameters": "ignore"},
        json={"messages": [{"role": "user", "content": "hi"}], "safe_mode": True},
    )
    assert dropped.status_code == 200


def test_api_version_is_required(gateway_url: str):
    response = httpx.get(f"{gateway_url}/azure/info")
    assert response.status_code == 400
    assert "api-version" in response.json()["message"]
    assert response.headers["x-ms-error-code"]


def test_unknown_deployment_header_is_404(gateway_url: str):
    response = httpx.post(
        f"{gateway_url}/azure/chat/completions",
        params=API_VERSION,
        headers={"azureml-model-deployment": "nope"},
        json={"messages": [{"role": "user", "content": "hi"}]},
    )
    assert response.status_code == 404
    assert response.json() == {
        "error": {"code": "DeploymentNotFound", "message": "Deployment 'nope' not found."},
        "message": "Deployment 'nope' not found.",
        "status": 404,
    }
    assert response.headers["x-ms-error-code"] == "DeploymentNotFound"


@pytest.mark.parametrize(
    ("policy", "status", "usage_chunks"),
    [("drop", 200, 1), ("pass-through", 200, 1), ("error", 400, None)],
)
def test_parameters_azure_does_not_define_are_extra(gateway_url: str, policy, status, usage_chunks):
    """`stream_options` is not in Azure's document: it is an extra parameter like any other,
    dropped, passed through or refused as `extra-parameters` says, never read as if defined (the
    usage is in the last chunk either way, as azure.yaml says, never in a chunk of its own)."""
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "n": {"": None},  # a wrong type for what it is elsewhere: untouched, never a 500
    }
    response = httpx.post(
        f"{gateway_url}/azure/chat/completions",
        params=API_VERSION,
        json=body,
        headers={"extra-parameters": policy},
    )
    assert response.status_code == status, response.text
    if status == 200:
        chunks = [line for line in response.text.splitlines() if line.startswith("data: {")]
        assert sum('"usage"' in chunk for chunk in chunks) == usage_chunks
        assert sum('"choices":[]' in chunk for chunk in chunks) == 0


SEED_EXAMPLE = {  # the seed's own sample request (its api-version is 2024-04-01-preview)
    "messages": [
        {"role": "system", "content": "You are a helpful assistant"},
        {"role": "user", "content": "Explain Riemann's conjecture"},
        {"role": "assistant", "content": "The Riemann Conjecture is a deep mathematical conjecture."},
        {"role": "user", "content": "Ist it proved?"},
    ],
    "frequency_penalty": 0,
    "presence_penalty": 0,
    "max_tokens": 256,
    "seed": 42,
    "stop": "<|endoftext|>",
    "stream": False,
    "temperature": 0,
    "top_p": 1,
    "response_format": {"type": "text"},
}
SEED_SHAPED = [
    # parts as the seed writes them ({type, content, detail}), `image` among them
    [{"role": "user", "content": [
        {"type": "text", "content": "What is on it?"},
        {"type": "image", "content": "data:image/png;base64,iVBORw0KGgo=", "detail": "low"},
        {"type": "image_url", "content": "https://example.com/cat.png", "detail": "auto"},
    ]}],
    # parts on a system message, the seed's one shape for every role
    [{"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
     {"role": "user", "content": "Hi"}],
    # a tool message as the seed has it: no tool_call_id
    [{"role": "user", "content": "Weather?"},
     {"role": "assistant", "content": None, "tool_calls": [
         {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]},
     {"role": "tool", "content": "22 degrees"},
     {"role": "user", "content": "Thanks"}],
]  # fmt: skip


@pytest.mark.parametrize("version", ["2024-04-01-preview", "2024-05-01-preview", "2024-05-01"])
def test_the_seeds_example_request_is_answered(gateway_url: str, version: str):
    response = httpx.post(
        f"{gateway_url}/azure/chat/completions", params={"api-version": version}, json=SEED_EXAMPLE
    )
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"]


@pytest.mark.parametrize("version", ["banana", "2024-05-01-beta", "24-05-01", ""])
def test_an_api_version_not_in_the_seeds_format_is_400(gateway_url: str, version: str):
    response = httpx.post(
        f"{gateway_url}/azure/chat/completions", params={"api-version": version}, json=SEED_EXAMPLE
    )
    assert response.status_code == 400, response.text
    assert response.json()["param"] == "api-version"
    assert response.headers["x-ms-error-code"] == "BadRequest"


@pytest.mark.parametrize("messages", SEED_SHAPED, ids=["seed parts", "system parts", "tool without id"])
def test_seed_shaped_messages_are_answered(gateway_url: str, messages: list):
    response = httpx.post(
        f"{gateway_url}/azure/chat/completions", params=API_VERSION, json={"messages": messages}
    )
    assert response.status_code == 200, response.text


def test_a_value_the_document_leaves_to_the_model_is_not_a_400(gateway_url: str):
    """The seed: temperature is non-negative and the penalties unbounded; the model decides, with
    422 when it cannot (tests/integration/test_policy.py). Echo takes any value."""
    body = {"messages": [{"role": "user", "content": "hi"}], "temperature": 3, "frequency_penalty": 5}
    assert (
        httpx.post(f"{gateway_url}/azure/chat/completions", params=API_VERSION, json=body).status_code == 200
    )
    negative = {**body, "temperature": -1}
    response = httpx.post(f"{gateway_url}/azure/chat/completions", params=API_VERSION, json=negative)
    assert response.status_code == 400 and response.json()["param"] == "temperature"
