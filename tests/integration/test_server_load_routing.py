"""Routing on what the servers say (`routing.load_from: metrics`) and by prefix affinity, through
a real `chatgate serve` in front of stand-in replicas on loopback that publish /metrics exactly
as vLLM and llama.cpp's server write it."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.support.metrics_replica import MetricsReplica
from tests.support.servers import running_gateway

pytestmark = pytest.mark.slow  # a gateway process and waits for its reads

INTERVAL = 0.2  # seconds between two reads of a replica's /metrics
KINDS = ("vllm", "llamacpp")
TENANT = "You answer for the tenant's support desk, politely and briefly. " * 30


@pytest.fixture(scope="module")
def replicas() -> Iterator[dict[str, list[MetricsReplica]]]:
    pairs = {
        name: [MetricsReplica("vllm" if name != "llamacpp" else "llamacpp") for _ in range(2)]
        for name in ("vllm", "llamacpp", "wedged", "affine", "affine-full")
    }
    servers = [server for pair in pairs.values() for server in pair]
    for server in servers:
        server.__enter__()
    try:
        yield pairs
    finally:
        for server in servers:
            server.__exit__(None, None, None)


def deployment(
    name: str, pair: list[MetricsReplica], routing: dict[str, Any], **config: Any
) -> dict[str, Any]:
    return {
        "name": name,
        "backend": "openai-compatible",
        "model": "m",
        "replicas": [{"name": f"r{i}", "options": {"base_url": r.base_url}} for i, r in enumerate(pair)],
        "routing": routing,
        "health": {"failures": 1000},
        **config,
    }


@pytest.fixture(scope="module")
def gateway(replicas: dict[str, list[MetricsReplica]], tmp_path_factory, log_dir: Path) -> Iterator[str]:
    on_metrics = {"load_from": "metrics", "scrape_interval": INTERVAL}
    affinity = {"affinity": {"enabled": True, "block_chars": 64}}
    deployments = [
        deployment("vllm", replicas["vllm"], on_metrics),
        deployment("llamacpp", replicas["llamacpp"], on_metrics),
        deployment("wedged", replicas["wedged"], {**on_metrics, "scrape_timeout": 0.3, "stale_after": 2}),
        deployment("affine", replicas["affine"], {**on_metrics, **affinity}),
        deployment("affine-full", replicas["affine-full"], affinity, concurrency={"max_concurrent": 1}),
    ]
    config = tmp_path_factory.mktemp("server-load") / "config.yaml"
    config.write_text(yaml.safe_dump({"deployments": deployments}))
    with running_gateway(log_dir, config) as url:
        yield url


def ask(gateway: str, model: str, system: str = "", question: str = "hello", **fields: Any) -> None:
    messages = [{"role": "system", "content": system}] if system else []
    body = {"model": model, "messages": [*messages, {"role": "user", "content": question}], **fields}
    answer = httpx.post(f"{gateway}/v1/chat/completions", json=body, timeout=30)
    assert answer.status_code == 200, answer.text


def served(pair: list[MetricsReplica], send: Callable[[], None], times: int) -> list[int]:
    before = [r.served for r in pair]
    for _ in range(times):
        send()
    return [r.served - b for r, b in zip(pair, before, strict=True)]


def read_again(pair: list[MetricsReplica], reads: int = 2, within: float = 10) -> None:
    """Until every replica's /metrics has been read `reads` more times (the gateway saw the
    load the test set)."""
    answering = [r for r in pair if r.metrics_answer]
    wanted = [r.scraped + reads for r in answering]
    ends = time.monotonic() + within
    while any(r.scraped < w for r, w in zip(answering, wanted, strict=True)):
        assert time.monotonic() < ends, "the gateway stopped reading /metrics"
        time.sleep(0.05)


def metric(gateway: str, name: str) -> float:
    for line in httpx.get(f"{gateway}/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.rpartition(" ")[2])
    return 0.0


@pytest.mark.parametrize("kind", KINDS)
def test_requests_go_to_the_replica_whose_server_says_it_is_less_busy(
    gateway: str, replicas: dict[str, list[MetricsReplica]], kind: str
) -> None:
    a, b = pair = replicas[kind]
    a.say(running=6, waiting=4)  # llama.cpp: 6 slots busy, 4 deferred
    b.say(running=0)
    read_again(pair)
    assert served(pair, lambda: ask(gateway, kind), 12) == [0, 12]
    a.say(running=0)
    b.say(running=3, waiting=2)
    read_again(pair)
    assert served(pair, lambda: ask(gateway, kind), 12) == [12, 0]


def test_a_replica_whose_metrics_stop_answering_keeps_serving_on_the_gateways_count(
    gateway: str, replicas: dict[str, list[MetricsReplica]]
) -> None:
    a, b = pair = replicas["wedged"]
    a.say(running=50)
    b.say(running=0)
    read_again(pair)
    assert served(pair, lambda: ask(gateway, "wedged"), 6) == [0, 6]
    b.say(running=30)
    a.metrics_answer = False  # its last word stays 50 until it goes stale
    read_again(pair)
    time.sleep(2 * INTERVAL + 0.3 + 0.5)  # stale_after × interval + the read's timeout, and more
    read_again(pair)
    counts = served(pair, lambda: ask(gateway, "wedged"), 8)
    assert counts == [8, 0]  # weighed by the gateway's count (0 in flight) against b's 30
    assert metric(gateway, 'chatgate_replica_healthy{deployment="wedged",replica="r0"}') == 1
    a.metrics_answer = True


def test_a_conversation_goes_back_to_the_replica_that_holds_its_prefix(
    gateway: str, replicas: dict[str, list[MetricsReplica]]
) -> None:
    pair = replicas["affine"]
    hits = 'chatgate_route_affinity_total{deployment="affine",outcome="hit"}'
    misses = 'chatgate_route_affinity_total{deployment="affine",outcome="miss"}'
    before_hits, before_misses = metric(gateway, hits), metric(gateway, misses)
    counts = served(pair, lambda: ask(gateway, "affine", TENANT, f"question {time.monotonic()}"), 8)
    assert sorted(counts) == [0, 8]
    assert metric(gateway, hits) - before_hits == 7
    assert metric(gateway, misses) - before_misses == 1
    # a client's key keeps short prompts together too
    keyed = served(pair, lambda: ask(gateway, "affine", "", f"hi {time.monotonic()}", user="u-1"), 6)
    assert sorted(keyed) == [0, 6]
    cache_keyed = served(
        pair, lambda: ask(gateway, "affine", "", f"hi {time.monotonic()}", prompt_cache_key="c-9"), 6
    )
    assert sorted(cache_keyed) == [0, 6]


def test_the_agent_dialects_keys_keep_a_session_on_one_replica(
    gateway: str, replicas: dict[str, list[MetricsReplica]]
) -> None:
    """Codex CLI names its conversation in the Responses API's `prompt_cache_key`, Claude Code
    its session in the Messages API's `metadata.user_id`: each keeps the session on one replica
    even when the prompts share nothing."""
    pair = replicas["affine"]

    def responses() -> None:
        body = {"model": "affine", "input": f"hi {time.monotonic()}", "prompt_cache_key": "codex-1"}
        answer = httpx.post(f"{gateway}/v1/responses", json=body, timeout=30)
        assert answer.status_code == 200, answer.text

    def messages() -> None:
        body = {
            "model": "affine",
            "max_tokens": 16,
            "messages": [{"role": "user", "content": f"hi {time.monotonic()}"}],
            "metadata": {"user_id": "claude-session-1"},
        }
        answer = httpx.post(f"{gateway}/anthropic/v1/messages", json=body, timeout=30)
        assert answer.status_code == 200, answer.text

    assert sorted(served(pair, responses, 6)) == [0, 6]
    assert sorted(served(pair, messages, 6)) == [0, 6]


@pytest.mark.parametrize("header", ["X-Claude-Code-Session-Id", "session-id", "x-session-id"])
def test_a_session_header_keeps_a_session_on_one_replica(
    gateway: str, replicas: dict[str, list[MetricsReplica]], header: str
) -> None:
    """Claude Code and Codex CLI also name their session in a header; a client that sends only
    that header, and prompts that share nothing, stays on one replica; another session may
    go elsewhere, and its requests stay together too."""
    pair = replicas["affine"]
    for session in ("s-1", "s-2"):

        def send(session: str = session) -> None:
            body = {"model": "affine", "messages": [{"role": "user", "content": f"hi {time.monotonic()}"}]}
            named = {header: f"{header}-{session}"}
            answer = httpx.post(f"{gateway}/v1/chat/completions", json=body, headers=named, timeout=30)
            assert answer.status_code == 200, answer.text

        assert sorted(served(pair, send, 6)) == [0, 6]


def test_affinity_never_sends_work_to_a_full_replica(
    gateway: str, replicas: dict[str, list[MetricsReplica]]
) -> None:
    pair = replicas["affine-full"]
    counts = served(pair, lambda: ask(gateway, "affine-full", TENANT, "warm up"), 1)
    holder, other = (pair[0], pair[1]) if counts == [1, 0] else (pair[1], pair[0])
    holder.slow_ms = 3000
    overridden = 'chatgate_route_affinity_total{deployment="affine-full",outcome="overridden"}'
    before = metric(gateway, overridden)
    with ThreadPoolExecutor(1) as pool:
        holding = pool.submit(ask, gateway, "affine-full", TENANT, "a long one")
        ends = time.monotonic() + 5
        while holder.served < 2:  # its one slot is taken
            assert time.monotonic() < ends
            time.sleep(0.02)
        began = time.monotonic()
        ask(gateway, "affine-full", TENANT, "while it is busy")
        assert time.monotonic() - began < 2  # not queued behind the slow one
        holding.result(timeout=10)
    holder.slow_ms = 0
    assert other.served == 1
    assert metric(gateway, overridden) - before == 1
