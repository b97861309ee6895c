"""A native pass-through in front of llama.cpp's own server and vLLM (both speak Messages and
Responses): a real `chatgate serve` with `native: [messages, responses]`, the official anthropic
and openai SDKs against it. The upstream's answer comes through (the same
text the server gives directly), usage is the server's own (in /metrics and charged to the key's
budget), `thinking`/`cache_control` are not named dropped, and the server's broken streams (its
first token an incomplete UTF-8 sequence: no `message_start`, `response.created` twice) end as
upstream failures, never as a clean 200 stream."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import anthropic
import httpx
import openai
import pytest
import yaml

from gateway.policy.auth import new_key
from tests.support.real_servers import RunningServer, cached_gguf, cached_model, llama_server, vllm_server
from tests.support.servers import running_gateway

pytestmark = [pytest.mark.system, pytest.mark.slow]

KEY, KEY_SHA = new_key()
BUDGET_KEY, BUDGET_SHA = new_key()
BUDGET = 60  # tokens a day: a few answers of the tiny model
# With the tiny random model at temperature 0, these prompts' first token is a whole UTF-8
# character (the server's streams are well formed) or an incomplete one (they are broken).
GOOD_PROMPT = "Name a river"
BROKEN_PROMPT = "Hello there"
MAX_TOKENS = 8
MAX_OUTPUT = 16  # the least the Responses API takes
GREEDY = {"temperature": 0}  # the anthropic SDK no longer names temperature; the API takes it


@dataclass(frozen=True)
class Native:
    name: str
    server: RunningServer
    gateway: str

    def direct(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """The server's own answer, asked directly."""
        answer = httpx.post(
            f"{self.server.base_url}{path}", json={**body, "model": self.server.model}, timeout=60
        )
        assert answer.status_code == 200, answer.text
        result: dict[str, Any] = answer.json()
        return result

    def streamed_text(self, path: str, body: dict[str, Any]) -> str:
        """The text of the server's own stream, asked directly (llama.cpp's server streams
        other words than it answers whole when tokens split UTF-8 characters)."""
        sent = {**body, "model": self.server.model, "stream": True}
        answer = httpx.post(f"{self.server.base_url}{path}", json=sent, timeout=60)
        assert answer.status_code == 200, answer.text
        texts = []
        for line in answer.text.splitlines():
            if line.startswith("data: "):
                event = json.loads(line[6:])
                if event["type"] == "content_block_delta" and event["delta"]["type"] == "text_delta":
                    texts.append(event["delta"]["text"])
                elif event["type"] == "response.output_text.delta":
                    texts.append(event["delta"])
        return "".join(texts)

    def metric(self, name: str, **labels: str) -> float:
        text = httpx.get(f"{self.gateway}/metrics", timeout=10).text
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
        return total


@pytest.fixture(scope="module")
def native(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Native]:
    """The named server (`llama.cpp`: its own server on the tiny model; `vllm`: on `tiny64`,
    whose head size vLLM's CPU attention takes) behind a gateway whose deployment `tiny` passes
    Messages and Responses through."""
    name = request.param
    workdir = tmp_path_factory.mktemp(f"native-{name}")
    with ExitStack() as stack:
        if name == "llama.cpp":
            server = stack.enter_context(llama_server(cached_gguf("tiny"), workdir))
        else:
            server = stack.enter_context(vllm_server(cached_model("tiny64"), workdir))
        options = {
            "base_url": server.base_url,
            "upstream_model": server.model,
            "native": ["messages", "responses"],
        }
        config = {
            "keys": [
                {"name": "native-test", "sha256": KEY_SHA},
                {"name": "budgeted", "sha256": BUDGET_SHA, "budgets": [{"tokens": BUDGET, "per": "day"}]},
            ],
            "deployments": [{"name": "tiny", "backend": "openai-compatible", "options": options}],
        }
        path = workdir / "chatgate.yaml"
        path.write_text(yaml.safe_dump(config))
        gateway = stack.enter_context(running_gateway(workdir, path))
        yield Native(name, server, gateway)


BOTH = pytest.mark.parametrize("native", ["llama.cpp", "vllm"], indirect=True)
# the broken streams are llama.cpp's server's (vLLM's are well formed)
LLAMA = pytest.mark.parametrize("native", ["llama.cpp"], indirect=True)


def anthropic_client(native: Native, key: str = KEY) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=f"{native.gateway}/anthropic", api_key=key, max_retries=0)


def openai_client(native: Native) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{native.gateway}/v1", api_key=KEY, max_retries=0)


def user(text: str) -> list[dict[str, Any]]:
    """A user turn whose block asks for caching (a field the chat pivot would drop)."""
    return [
        {"role": "user", "content": [{"type": "text", "text": text, "cache_control": {"type": "ephemeral"}}]}
    ]


def message_text(body: Any) -> str:
    return "".join(block["text"] for block in body["content"] if block["type"] == "text")


@BOTH
def test_the_anthropic_sdk_gets_the_servers_own_message(native: Native) -> None:
    client = anthropic_client(native)
    params: dict[str, Any] = {"max_tokens": MAX_TOKENS, "messages": user(GOOD_PROMPT)}
    raw = client.messages.with_raw_response.create(model="tiny", **params, extra_body=GREEDY)
    assert "x-chatgate-dropped-params" not in raw.headers  # cache_control went upstream
    message = raw.parse()
    direct = native.direct("/messages", {**params, **GREEDY})
    assert message.content[0].type == "text"
    assert message.content[0].text == message_text(direct)
    assert message.model == "tiny" and message.stop_reason == direct["stop_reason"]
    assert message.usage.output_tokens == direct["usage"]["output_tokens"]


@BOTH
def test_the_anthropic_sdk_streams_the_servers_own_events(native: Native) -> None:
    client = anthropic_client(native)
    params: dict[str, Any] = {"max_tokens": MAX_TOKENS, "messages": user(GOOD_PROMPT)}
    before = native.metric("chatgate_usage_tokens_total", deployment="tiny", type="output")
    with client.messages.stream(model="tiny", **params, extra_body=GREEDY) as stream:
        assert "x-chatgate-dropped-params" not in stream.response.headers
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == native.streamed_text("/messages", {**params, **GREEDY})
    assert final.usage.output_tokens > 0
    after = native.metric("chatgate_usage_tokens_total", deployment="tiny", type="output")
    assert after - before == final.usage.output_tokens  # the server's own count


@BOTH
def test_the_openai_sdk_gets_the_servers_own_response_whole_and_streamed(native: Native) -> None:
    client = openai_client(native)
    params: dict[str, Any] = {"input": GOOD_PROMPT, "max_output_tokens": MAX_OUTPUT, "temperature": 0}
    direct = native.direct("/responses", params)
    direct_text = "".join(
        part["text"] for item in direct["output"] if item["type"] == "message" for part in item["content"]
    )
    response = client.responses.create(model="tiny", **params)
    assert response.output_text == direct_text and response.model == "tiny"
    assert response.usage is not None and response.usage.output_tokens == direct["usage"]["output_tokens"]
    before = native.metric("chatgate_usage_tokens_total", deployment="tiny", type="input")
    with client.responses.stream(model="tiny", **params) as stream:
        final = stream.get_final_response()
    assert final.output_text == native.streamed_text("/responses", params)
    assert final.usage is not None
    after = native.metric("chatgate_usage_tokens_total", deployment="tiny", type="input")
    assert after - before == final.usage.input_tokens


@BOTH
def test_thinking_reaches_the_server_and_is_not_named_dropped(native: Native) -> None:
    """vLLM reads `thinking` and holds it to Anthropic's rules (a budget of at least 1024 tokens,
    less than max_tokens: more than the tiny models' window), so its own 400 for a budget past
    max_tokens shows the field arrived; llama.cpp's server takes it and answers."""
    body = {
        "model": "tiny",
        "max_tokens": MAX_TOKENS,
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "messages": user(GOOD_PROMPT),
    }
    answer = httpx.post(
        f"{native.gateway}/anthropic/v1/messages", json=body, headers={"x-api-key": KEY}, timeout=60
    )
    if native.name == "vllm":
        assert answer.status_code == 400, answer.text
        assert "budget_tokens must be less than max_tokens" in answer.json()["error"]["message"]
        return
    assert answer.status_code == 200, answer.text
    assert "x-chatgate-dropped-params" not in answer.headers
    assert answer.json()["type"] == "message"


@LLAMA
def test_the_servers_broken_messages_stream_is_an_upstream_failure(native: Native) -> None:
    params: dict[str, Any] = {"max_tokens": MAX_TOKENS, "messages": user(BROKEN_PROMPT)}
    # the defect is the server's: its own stream has no message_start
    direct = httpx.post(
        f"{native.server.base_url}/messages",
        json={**params, **GREEDY, "model": native.server.model, "stream": True},
        timeout=60,
    )
    kinds = [json.loads(line[6:])["type"] for line in direct.text.splitlines() if line.startswith("data: ")]
    assert kinds and "message_start" not in kinds
    errors = native.metric("chatgate_upstream_errors_total", deployment="tiny")
    client = anthropic_client(native)
    with (
        pytest.raises(anthropic.APIStatusError) as raised,
        client.messages.stream(model="tiny", **params, extra_body=GREEDY) as stream,
    ):
        "".join(stream.text_stream)
    assert raised.value.status_code == 502
    assert "before message_start" in str(raised.value)
    assert native.metric("chatgate_upstream_errors_total", deployment="tiny") > errors


@LLAMA
def test_the_servers_broken_responses_stream_is_an_upstream_failure(native: Native) -> None:
    params: dict[str, Any] = {"input": BROKEN_PROMPT, "max_output_tokens": MAX_OUTPUT, "temperature": 0}
    direct = httpx.post(
        f"{native.server.base_url}/responses",
        json={**params, "model": native.server.model, "stream": True},
        timeout=60,
    )
    kinds = [json.loads(line[6:])["type"] for line in direct.text.splitlines() if line.startswith("data: ")]
    assert kinds.count("response.created") > 1  # the server's own defect
    errors = native.metric("chatgate_upstream_errors_total", deployment="tiny")
    answer = httpx.post(
        f"{native.gateway}/v1/responses",
        json={**params, "model": "tiny", "stream": True},
        headers={"authorization": f"Bearer {KEY}"},
        timeout=60,
    )
    got = [json.loads(line[6:]) for line in answer.text.splitlines() if line.startswith("data: ")]
    # caught before the first byte (a 502), or after it: the stream ends with an error event
    if answer.status_code == 200:
        assert got[-1]["type"] == "error" and "a second response.created" in got[-1]["message"]
        assert not any(event["type"] == "response.completed" for event in got)
    else:
        assert answer.status_code == 502, answer.text
    assert native.metric("chatgate_upstream_errors_total", deployment="tiny") > errors
    # the SDK raises APIError on the 502; on a 200 stream that ends with the Responses API's
    # `error` event (no `error` member, which is what its APIError looks for) it finds no
    # response.completed and raises that: either way no final response is made up
    client = openai_client(native)
    with (
        pytest.raises((openai.APIError, RuntimeError)),
        client.responses.stream(model="tiny", **params) as stream,
    ):
        stream.get_final_response()


@BOTH
def test_a_keys_budget_is_charged_the_servers_own_usage(native: Native) -> None:
    client = anthropic_client(native, BUDGET_KEY)
    params: dict[str, Any] = {"max_tokens": MAX_TOKENS, "messages": user(GOOD_PROMPT)}
    used = 0
    for _ in range(20):
        try:
            message = client.messages.create(model="tiny", **params, extra_body=GREEDY)
        except anthropic.RateLimitError as refused:
            spent = re.search(r"\(([\d,.]+) spent\)", str(refused))
            assert spent is not None, str(refused)
            assert float(spent[1].replace(",", "")) == used
            assert used <= BUDGET
            return
        usage = message.usage
        used += usage.input_tokens + (usage.cache_read_input_tokens or 0) + usage.output_tokens
    pytest.fail(f"the budget of {BUDGET} tokens never ran out ({used} used)")
