"""The limit store under load and under failure, with a real Redis and real gateway processes:
hundreds of requests in flight on one worker (more than the Redis connections it holds), a
store flushed while requests are in flight, and a gateway killed with streams in flight."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
import yaml

from gateway.core.token_count import estimate
from gateway.policy.auth import new_key
from tests.support.redis_server import running_redis
from tests.support.servers import running_gateway

KEY, KEY_SHA = new_key()
AUTH = {"authorization": f"Bearer {KEY}"}
MESSAGES = [{"role": "user", "content": "count me"}]
IN_FLIGHT = 300  # requests at once on one worker: three times redis-py's default pool


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory) -> Iterator[str]:
    with running_redis(tmp_path_factory.mktemp("redis")) as (url, _process):
        yield url


def write_config(path: Path, settings: dict) -> Path:
    path.write_text(yaml.safe_dump(settings))
    return path


async def at_once(url: str, count: int, body: dict) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=count, max_keepalive_connections=count)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        return await asyncio.gather(
            *(client.post(f"{url}/v1/chat/completions", json=body, headers=AUTH) for _ in range(count))
        )


@pytest.mark.parametrize("on_error", ["fail-closed", "fail-open"])
def test_hundreds_in_flight_on_one_worker_keep_limits_and_budget(tmp_path, log_dir, redis_url, on_error):
    """Regression (issue 24, item 6): redis-py's pool of 100 connections ran out, and the breaker
    took "Too many connections" for the store failing: 503s under fail-closed, an unlimited
    budget under fail-open. Now calls beyond the pool wait for a connection: with Redis healthy,
    the budget admits exactly what fits and refuses the rest with 429, never 503."""
    redis.Redis.from_url(redis_url).flushall()
    per_request = estimate(MESSAGES)  # stopped at the first character: no completion tokens
    fits = 50
    settings = {
        "keys": [
            {
                "name": "busy",
                "sha256": KEY_SHA,
                "limits": {"requests_per_minute": 100_000, "tokens_per_minute": 10_000_000},
                "budgets": [{"tokens": fits * per_request, "per": "day"}],
            }
        ],
        "rate_limits": {"store": "redis", "redis": {"url": redis_url, "on_error": on_error}},
    }
    body = {"model": "echo", "messages": MESSAGES, "stop": ["["]}
    with running_gateway(log_dir, write_config(tmp_path / "load.yaml", settings)) as url:
        responses = asyncio.run(at_once(url, IN_FLIGHT, body))
        log = max(log_dir.glob("gateway-*.log"), key=lambda p: p.stat().st_mtime).read_text()
    statuses = Counter(r.status_code for r in responses)
    assert statuses == {200: fits, 429: IN_FLIGHT - fits}, (statuses, log[-2000:])
    admitted = [r.json()["usage"] for r in responses if r.status_code == 200]
    assert {u["total_tokens"] for u in admitted} == {per_request}
    codes = {r.json()["error"]["code"] for r in responses if r.status_code == 429}
    assert codes == {"BudgetExceeded"}
    assert "breaker open" not in log
