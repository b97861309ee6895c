"""The official SDKs pointed where chatgate serves nothing, against a running `chatgate serve`:
each gets a 404 whose message says where to go, the advice followed works, and the operator
sees every one of them in the access log and in /metrics under the one route `unmatched`.

openai's `AzureOpenAI` client speaks Azure OpenAI (the deployment in the path); chatgate serves
Azure AI Model Inference at /azure, and does not alias the one onto the other
(docs/getting-started/azure-clients.md says why)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import anthropic
import httpx
import openai
import orjson
import pytest

from tests.support.gateway_process import GatewayProcess, gateway_process

API_VERSION = "2024-05-01-preview"
MESSAGES: list = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    with gateway_process(tmp_path_factory.mktemp("unserved")) as running:
        yield running


def not_found(call) -> str:
    with pytest.raises((openai.NotFoundError, anthropic.NotFoundError)) as raised:
        call()
    assert raised.value.status_code == 404
    return raised.value.message


def access_lines(gateway: GatewayProcess) -> list[dict]:
    return [orjson.loads(line) for line in gateway.output().splitlines() if line.startswith('{"ts"')]


def test_sdks_pointed_at_unserved_paths_are_told_where_to_go(gateway: GatewayProcess):
    url = gateway.url
    azure_openai = openai.AzureOpenAI(
        azure_endpoint=f"{url}/azure", api_version="2024-10-21", api_key="any", max_retries=0
    )
    said = not_found(lambda: azure_openai.chat.completions.create(model="echo", messages=MESSAGES))
    assert f"POST /azure/chat/completions?api-version={API_VERSION}" in said
    assert f'OpenAI(base_url="{url}/azure", default_query={{"api-version": "{API_VERSION}"}})' in said

    # the advice, followed with the same SDK
    advised = openai.OpenAI(
        base_url=f"{url}/azure", default_query={"api-version": API_VERSION}, api_key="any", max_retries=0
    )
    answer = advised.chat.completions.create(model="echo", messages=MESSAGES)
    assert answer.choices[0].message.content

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="any", max_retries=0)
    said = not_found(lambda: client.embeddings.create(model="echo", input="hi"))
    assert "chatgate does not serve embeddings" in said and "POST /v1/chat/completions" in said

    doubled = openai.OpenAI(base_url=f"{url}/v1/v1", api_key="any", max_retries=0)
    said = not_found(lambda: doubled.chat.completions.create(model="echo", messages=MESSAGES))
    assert "once too often" in said

    claude = anthropic.Anthropic(base_url=url, api_key="any", max_retries=0)
    said = not_found(lambda: claude.messages.create(model="echo", max_tokens=16, messages=MESSAGES))
    assert f"ANTHROPIC_BASE_URL={url}/anthropic" in said

    metrics = httpx.get(f"{url}/metrics").text
    unmatched = [
        float(value)
        for labels, value in re.findall(r"^chatgate_requests_total\{([^}]*)\} (\S+)$", metrics, re.MULTILINE)
        if 'route="unmatched"' in labels
    ]
    assert sum(unmatched) == 4
    assert "/deployments/" not in metrics and "embeddings" not in metrics
    lines = access_lines(gateway)
    refused = [(ln["method"], ln["path"], ln["status"]) for ln in lines if ln["route"] == "unmatched"]
    assert refused == [
        ("POST", "/azure/openai/deployments/echo/chat/completions", 404),
        ("POST", "/v1/embeddings", 404),
        ("POST", "/v1/v1/chat/completions", 404),
        ("POST", "/v1/messages", 404),
    ]
    assert not any("api-version" in line["path"] or line["key"] == "any" for line in lines)
