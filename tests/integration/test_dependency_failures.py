"""A dependency's hiccup stays its own: a hung Redis (SIGSTOP) costs a few timeouts, not one per
request; it is never counted against a healthy replica; /ready says so while it lasts; the log
says it once, not once a request."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway.policy.auth import new_key
from tests.support.gateway_process import GatewayProcess, gateway_process
from tests.support.redis_server import running_redis

pytestmark = pytest.mark.slow  # out of the fast lane (docs/development/tests.md)

KEY, KEY_SHA = new_key()
HANG_SECONDS = 4
BREAKER = {"failures": 3, "reset_after": 1}


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[tuple[str, object]]:
    with running_redis(tmp_path) as found:
        yield found


@pytest.fixture(params=["fail-open", "fail-closed"])
def gateway(request, redis, tmp_path: Path) -> Iterator[tuple[GatewayProcess, object, str]]:
    url, process = redis
    config = {
        "keys": [{"name": "team", "sha256": KEY_SHA, "limits": {"requests_per_minute": 100000}}],
        "rate_limits": {
            "store": "redis",
            "redis": {"url": url, "on_error": request.param, "timeout": 0.25, "breaker": BREAKER},
        },
    }
    with gateway_process(tmp_path, config) as gateway:
        yield gateway, process, request.param


def chat(client: httpx.Client, url: str) -> httpx.Response:
    return client.post(
        f"{url}/v1/chat/completions",
        json={"model": "echo", "messages": [{"role": "user", "content": "hi"}]},
        headers={"authorization": f"Bearer {KEY}"},
    )


def test_a_hung_store_costs_a_few_timeouts_and_ejects_nothing(gateway):
    process, redis_process, mode = gateway
    with httpx.Client(timeout=10) as client:
        assert chat(client, process.url).status_code == 200
        redis_process.send_signal(signal.SIGSTOP)
        try:
            answers: list[tuple[int, float]] = []
            ends = time.monotonic() + HANG_SECONDS
            while time.monotonic() < ends:
                began = time.monotonic()
                status = chat(client, process.url).status_code
                answers.append((status, time.monotonic() - began))
            ready_during = httpx.get(f"{process.url}/ready").status_code
        finally:
            redis_process.send_signal(signal.SIGCONT)
        time.sleep(BREAKER["reset_after"] + 0.5)  # the breaker probes again and closes
        after = [chat(client, process.url).status_code for _ in range(5)]
        ready_after = httpx.get(f"{process.url}/ready")

    expected = 200 if mode == "fail-open" else 503
    assert {status for status, _ in answers} == {expected}, answers[:10]
    slow = [seconds for _, seconds in answers if seconds > 0.2]
    # a timeout per call until the breaker opens, then a probe a second: not one per request
    assert len(slow) <= BREAKER["failures"] + HANG_SECONDS + 1, slow
    assert len(answers) > 50, f"only {len(answers)} answers in {HANG_SECONDS} s"
    assert ready_during == (503 if mode == "fail-closed" else 200)
    # the echo replica was never blamed: everything is answered again at once
    assert after == [200] * 5
    assert ready_after.status_code == 200, ready_after.text
    log = process.output()
    assert log.count("rate-limit store") <= 2, log  # opened, closed: once each


def spent_in(url: str) -> float:
    """What the store's budget accounts say was spent, all of them together."""
    import redis as redis_client

    store = redis_client.Redis.from_url(url)
    total = 0.0
    for name in store.scan_iter("*"):
        if store.type(name) == b"hash" and (spent := store.hget(name, "spent")) is not None:
            total += float(spent)
    return total


def test_usage_served_while_the_store_was_away_is_recorded_once_it_is_back(redis, tmp_path: Path):
    """fail-open serves on while Redis is paused; what those answers used of the key's budget is
    recorded when Redis answers again, not lost."""
    url, redis_process = redis
    config = {
        "keys": [{"name": "team", "sha256": KEY_SHA, "budgets": [{"tokens": 10_000_000, "per": "day"}]}],
        "rate_limits": {
            "store": "redis",
            "redis": {"url": url, "on_error": "fail-open", "timeout": 0.25, "breaker": BREAKER},
        },
    }
    with gateway_process(tmp_path, config) as process, httpx.Client(timeout=10) as client:
        before = chat(client, process.url)
        assert before.status_code == 200
        per_answer = before.json()["usage"]["total_tokens"]
        assert spent_in(url) == per_answer
        redis_process.send_signal(signal.SIGSTOP)
        try:
            during = [chat(client, process.url).status_code for _ in range(20)]
        finally:
            redis_process.send_signal(signal.SIGCONT)
        assert during == [200] * 20
        time.sleep(BREAKER["reset_after"] + 0.5)
        assert chat(client, process.url).status_code == 200  # the store answers: what is owed is paid
        deadline = time.monotonic() + 10
        while spent_in(url) < 22 * per_answer and time.monotonic() < deadline:
            time.sleep(0.1)
        assert spent_in(url) == 22 * per_answer
        assert "budget usages served while it was away" in process.output()
