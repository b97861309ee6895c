"""Rate limits shared through a real Redis: two gateway processes, one key, exact limits."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
import yaml

from gateway.policy.auth import new_key
from tests.support.redis_server import running_redis
from tests.support.servers import free_port, running_gateway

N = 5
KEY, KEY_SHA = new_key()
PROMPT = "count me"  # estimated at ceil(8 / 4) + 3 = 5 tokens
PROMPT_TOKENS = 5


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory) -> Iterator[str]:
    with running_redis(tmp_path_factory.mktemp("redis")) as (url, _process):
        yield url


def write_config(path: Path, redis_url: str, limits: dict, on_error: str = "fail-closed") -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "keys": [{"name": "shared", "sha256": KEY_SHA, "limits": limits}],
                "rate_limits": {"store": "redis", "redis": {"url": redis_url, "on_error": on_error}},
            }
        )
    )
    return path


async def burst(urls: list[str], count: int, body: dict) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=30) as client:
        return await asyncio.gather(
            *(
                client.post(
                    f"{urls[i % len(urls)]}/v1/chat/completions",
                    json=body,
                    headers={"authorization": f"Bearer {KEY}"},
                )
                for i in range(count)
            )
        )


@pytest.fixture
def two_gateways(request, tmp_path, redis_url, log_dir) -> Iterator[list[str]]:
    redis.Redis.from_url(redis_url).flushall()
    config = write_config(tmp_path / "config.yaml", redis_url, request.param)
    with running_gateway(log_dir, config) as first, running_gateway(log_dir, config) as second:
        yield [first, second]


@pytest.mark.parametrize("two_gateways", [{"requests_per_minute": N}], indirect=True)
def test_requests_per_minute_hold_across_processes(two_gateways):
    body = {"model": "echo", "messages": [{"role": "user", "content": PROMPT}]}
    responses = asyncio.run(burst(two_gateways, 3 * N, body))
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [200] * N + [429] * (2 * N)
    for refused in (r for r in responses if r.status_code == 429):
        assert int(refused.headers["retry-after"]) >= 1
        assert refused.headers["x-ratelimit-remaining-requests"] == "0"
        assert refused.json()["error"]["type"] == "rate_limit_error"


@pytest.mark.parametrize("two_gateways", [{"tokens_per_minute": N * PROMPT_TOKENS}], indirect=True)
def test_tokens_per_minute_hold_across_processes(two_gateways):
    # stop at the first character: no completion tokens, so only prompt estimates count
    body = {"model": "echo", "messages": [{"role": "user", "content": PROMPT}], "stop": ["["]}
    responses = asyncio.run(burst(two_gateways, 3 * N, body))
    admitted = [r for r in responses if r.status_code == 200]
    assert len(admitted) == N
    assert all(r.json()["usage"]["completion_tokens"] == 0 for r in admitted)
    assert sorted(r.status_code for r in responses).count(429) == 2 * N


@pytest.mark.parametrize(("on_error", "status"), [("fail-closed", 503), ("fail-open", 200)])
def test_unreachable_redis(tmp_path, log_dir, on_error, status):
    """Every request is answered as the mode says; the outage is logged once, not per request,
    and the start says in one line that the store cannot be reached and what requests get."""
    dead = f"redis://127.0.0.1:{free_port()}/0"
    config = write_config(tmp_path / "config.yaml", dead, {"requests_per_minute": 10}, on_error)
    with running_gateway(log_dir, config) as url:
        responses = [
            httpx.post(
                f"{url}/v1/chat/completions",
                json={"model": "echo", "messages": [{"role": "user", "content": "hi"}]},
                headers={"authorization": f"Bearer {KEY}"},
                timeout=30,
            )
            for _ in range(6)
        ]
    assert [r.status_code for r in responses] == [status] * 6
    log = max(log_dir.glob("gateway-*.log"), key=lambda p: p.stat().st_mtime).read_text()
    assert log.count("rate-limit store") == 1 and "breaker open" in log and on_error in log
    said = [line for line in log.splitlines() if "cannot be reached" in line]
    assert len(said) == 1, log
    assert f"Redis for limits and budgets at 127.0.0.1:{dead.split(':')[2].split('/')[0]}/0" in said[0]
    assert ("refused with 503" if status == 503 else "admitted without limits") in said[0]
