"""The real servers of tests/support/real_servers.py with a real `chatgate serve` in front, as pytest
fixtures: `upstream` is the server a test names (`@pytest.mark.parametrize("upstream", [...],
indirect=True)`: "transformers", "llama.cpp" (llama.cpp's own server), "vllm" or "litellm"). A
test module imports the fixtures it uses; each server and its gateway start once per module,
when a test first needs them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.support.dialect_clients import DIALECTS, Answer, Dialect
from tests.support.real_servers import (
    RunningServer,
    cached_gguf,
    cached_model,
    litellm_proxy_server,
    llama_server,
    transformers_serve,
    vllm_server,
)
from tests.support.servers import started_gateway
from tests.support.tiny_model import save_tiny_model

DEPLOYMENT = "tiny"  # the gateway's deployment in front of the server (LiteLLM: its `mock`)
MODEL_SERVERS = ["transformers", "llama.cpp"]  # those that serve the tiny model
MESSAGES = [{"role": "user", "content": "Tell me about the river."}]
GREEDY = {"messages": MESSAGES, "temperature": 0, "max_tokens": 10}
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
FORCED_TOOL = {"type": "function", "function": {"name": "get_weather"}}


@dataclass(frozen=True)
class Upstream:
    """A real server with a gateway in front: `gateway` is the gateway's base URL, `deployment`
    the model name a client sends it."""

    name: str
    server: RunningServer
    gateway: str
    gateway_log: Path
    deployment: str = DEPLOYMENT

    def gateway_log_text(self) -> str:
        return self.gateway_log.read_text(errors="replace")

    def direct(self, body: dict[str, Any], model: str | None = None) -> dict[str, Any]:
        """The server's own answer to an OpenAI request sent to it directly."""
        headers = {"authorization": f"Bearer {self.server.api_key}"} if self.server.api_key else {}
        response = httpx.post(
            f"{self.server.base_url}/chat/completions",
            json={"model": model or self.server.model, **body},
            headers=headers,
            timeout=60,
        )
        assert response.status_code == 200, response.text
        return response.json()

    def requests_seen(self) -> int:
        """How many chat requests the server has answered, from its access log (uvicorn's), read
        once every earlier request is in it: the log line of a request sent after them."""
        log, marker = self.server.log, '"GET /v1/models HTTP/1.1" 200'
        before = log.read_text(errors="replace").count(marker)
        assert httpx.get(f"{self.server.base_url}/models", timeout=10).status_code == 200
        deadline = time.monotonic() + 10
        while (text := log.read_text(errors="replace")).count(marker) == before:
            assert time.monotonic() < deadline, f"no access log line in {log}"
            time.sleep(0.05)
        return text.count('"POST /v1/chat/completions HTTP/1.1"')

    def ask(
        self,
        dialect: Dialect,
        params: dict[str, Any],
        stream: bool = False,
        headers: dict[str, str] | None = None,
        model: str | None = None,
    ) -> Answer:
        send = dialect.stream if stream else dialect.complete
        return send(self.gateway, model or self.deployment, dict(params), headers or {})


def gateway_config(deployments: list[dict[str, Any]]) -> dict[str, Any]:
    return {"deployments": [{"backend": "openai-compatible", **d} for d in deployments]}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("tiny-model"))


def litellm_deployment(name: str, server: RunningServer, model: str) -> dict[str, Any]:
    options = {"base_url": server.base_url, "api_key": server.api_key, "upstream_model": model}
    return {"name": name, "options": options}


@contextmanager
def upstream_with_gateway(name: str, model_dir: Path, workdir: Path) -> Iterator[Upstream]:
    """The named server, and a gateway whose deployment `tiny` relays to it."""
    with ExitStack() as stack:
        if name == "transformers":
            server = stack.enter_context(transformers_serve(model_dir, workdir))
        elif name == "llama.cpp":
            server = stack.enter_context(llama_server(cached_gguf("tiny"), workdir))
        elif name == "vllm":
            server = stack.enter_context(vllm_server(cached_model("tiny64"), workdir))
        else:
            server = stack.enter_context(litellm_proxy_server(workdir))
        if name == "litellm":
            deployments = [
                litellm_deployment(DEPLOYMENT, server, "mock"),
                litellm_deployment("dead", server, "dead"),
                litellm_deployment("limited", server, "limited"),
                {"name": "no-key", "options": {"base_url": server.base_url, "upstream_model": "mock"}},
            ]
        else:
            # what a model server honours is probed, not assumed: features it ignores are 422s
            options = {"base_url": server.base_url, "upstream_model": server.model, "probe": True}
            deployments = [{"name": DEPLOYMENT, "options": options}]
        config = workdir / "chatgate.yaml"
        config.write_text(yaml.safe_dump(gateway_config(deployments)))
        _, gateway, log = stack.enter_context(started_gateway(workdir, config))
        if name != "litellm":
            probed(gateway)
        yield Upstream(name, server, gateway, log)


def probed(gateway: str, timeout: float = 120, key: str | None = None) -> dict[str, Any]:
    """Wait until the gateway's probes of its deployment are done; what they found (`key`: a
    gateway with keys shows them only to a caller with one)."""
    ends = time.monotonic() + timeout
    headers = {"authorization": f"Bearer {key}"} if key else {}
    while time.monotonic() < ends:
        probes = httpx.get(f"{gateway}/ready", headers=headers, timeout=10).json().get("probes", {})
        if probes.get(DEPLOYMENT, {}).get("state") == "done":
            return probes[DEPLOYMENT]
        time.sleep(0.2)
    raise AssertionError(f"the probes did not finish: {probes}")


# one fixture per server, not one module fixture parametrized: pytest groups a parametrized
# module fixture's tests only where every test lists the same values, and restarts it otherwise


@pytest.fixture(scope="module")
def transformers_upstream(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstream]:
    with upstream_with_gateway("transformers", model_dir, tmp_path_factory.mktemp("transformers")) as started:
        yield started


@pytest.fixture(scope="module")
def llama_cpp_upstream(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstream]:
    with upstream_with_gateway("llama.cpp", model_dir, tmp_path_factory.mktemp("llama.cpp")) as started:
        yield started


@pytest.fixture(scope="module")
def vllm_upstream(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstream]:
    """vLLM on the `tiny64` model (vLLM's CPU attention rejects the tiny model's head_dim 16)."""
    with upstream_with_gateway("vllm", model_dir, tmp_path_factory.mktemp("vllm")) as started:
        yield started


@pytest.fixture(scope="module")
def litellm_upstream(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstream]:
    with upstream_with_gateway("litellm", model_dir, tmp_path_factory.mktemp("litellm")) as started:
        yield started


def named_upstream(request: pytest.FixtureRequest) -> Upstream:
    """For a module's `upstream` fixture: the real server its test names (the `upstream`
    parameter), with a gateway in front, from the module fixture for that server."""
    return request.getfixturevalue(f"{request.param.replace('.', '_')}_upstream")


def on(*servers: str) -> pytest.MarkDecorator:
    return pytest.mark.parametrize("upstream", servers, indirect=True)


def dialects(having: str | None = None) -> pytest.MarkDecorator:
    """Every dialect, or those whose document lets a client ask for `having`."""
    chosen = [d for d in DIALECTS.values() if having is None or getattr(d, having)]
    return pytest.mark.parametrize("dialect", chosen, ids=lambda d: d.name)


def direct_text(body: dict[str, Any]) -> str:
    return body["choices"][0]["message"]["content"] or ""
