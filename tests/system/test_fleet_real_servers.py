"""A fleet in front of two real llama.cpp servers (llama-server, tests/support/real_servers.py):
the gateway reads their /metrics as they publish them and routes a conversation back to the
replica that holds its prefix, as its own metrics and the servers' prompt caches both show."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.support.real_servers import RunningServer, cached_gguf, llama_server
from tests.support.servers import started_gateway

pytestmark = pytest.mark.slow

SYSTEM = "You are the river guide. Tell the visitor about the hills, the trees and the bridge. " * 6
DEPLOYMENT = "fleet"


def metric(text: str, name: str) -> float:
    return sum(
        float(line.rpartition(" ")[2])
        for line in text.splitlines()
        if line.startswith((name + " ", name + "{"))
    )


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, log_dir: Path) -> Iterator[tuple[str, Path, list[RunningServer]]]:
    workdir = tmp_path_factory.mktemp("fleet-real")
    gguf = cached_gguf("tiny")
    with ExitStack() as stack:
        servers = [
            stack.enter_context(llama_server(gguf, workdir, context=512, alias="tiny")) for _ in range(2)
        ]
        deployment: dict[str, Any] = {
            "name": DEPLOYMENT,
            "backend": "openai-compatible",
            "model": "tiny",
            "replicas": [
                {"name": f"r{i}", "options": {"base_url": s.base_url}} for i, s in enumerate(servers)
            ],
            "routing": {
                "load_from": "metrics",
                "scrape_interval": 0.25,
                "affinity": {"enabled": True, "block_chars": 64},
            },
        }
        config = workdir / "config.yaml"
        config.write_text(yaml.safe_dump({"deployments": [deployment]}))
        _process, url, log = stack.enter_context(started_gateway(log_dir, config))
        yield url, log, servers


def test_a_conversation_goes_back_to_the_llama_server_that_caches_its_prefix(
    fleet: tuple[str, Path, list[RunningServer]],
) -> None:
    gateway, log, servers = fleet
    messages: list[dict[str, str]] = [{"role": "system", "content": SYSTEM}]
    for turn in range(5):
        messages.append({"role": "user", "content": f"What is at the bridge, part {turn}?"})
        answer = httpx.post(
            f"{gateway}/v1/chat/completions",
            json={"model": DEPLOYMENT, "messages": messages, "max_tokens": 4, "temperature": 0},
            timeout=120,
        )
        assert answer.status_code == 200, answer.text
        messages.append({"role": "assistant", "content": answer.json()["choices"][0]["message"]["content"]})
    ours = httpx.get(f"{gateway}/metrics").text
    hits = metric(ours, f'chatgate_route_affinity_total{{deployment="{DEPLOYMENT}",outcome="hit"}}')
    misses = metric(ours, f'chatgate_route_affinity_total{{deployment="{DEPLOYMENT}",outcome="miss"}}')
    assert (hits, misses) == (4, 1)
    # one server answered all five: its prompt cache served the conversation so far each time
    pages = [httpx.get(s.base_url.removesuffix("/v1") + "/metrics").text for s in servers]
    computed = [metric(page, "llamacpp:prompt_tokens_total") for page in pages]
    cached = [metric(page, "llamacpp:prompt_tokens_cached_total") for page in pages]
    assert min(computed) == 0 and max(cached) > 0, (computed, cached)
    # its /metrics were read (the gateway warns by replica name when a read fails)
    assert "no load read" not in log.read_text(errors="replace")
