"""The limit stores call by call: the Redis store's connections under more calls than it holds
(a real Redis)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import redis

from gateway.config import RedisLimits
from gateway.core.errors import ServiceUnavailable
from gateway.policy.limits import Bucket
from gateway.policy.redis_limiter import RedisLimiter
from tests.redis_server import running_redis


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory) -> Iterator[str]:
    with running_redis(tmp_path_factory.mktemp("redis")) as (url, _process):
        yield url


def limiter_for(redis_url: str, **settings) -> RedisLimiter:
    return RedisLimiter(RedisLimits(url=redis_url, **settings))


def bucket(capacity: int = 10_000) -> list[Bucket]:
    return [Bucket("key:pool:requests", "requests", capacity)]


def test_more_calls_at_once_than_connections_wait_for_one(redis_url):
    """300 calls at once on 2 connections: each waits its turn; none fails, none is counted
    against the store, and Redis sees no more connections than the pool holds."""
    store = redis.Redis.from_url(redis_url)
    store.flushall()

    async def scenario() -> tuple[list, int, int]:
        limiter = limiter_for(redis_url, max_connections=2)
        verdicts = await asyncio.gather(*(limiter.take(bucket(), 1) for _ in range(300)))
        connections = sum(1 for c in store.client_list() if c["cmd"] != "client|list")
        await limiter.aclose()
        return verdicts, limiter.breaker.failures, connections

    verdicts, failures, connections = asyncio.run(scenario())
    assert all(v.allowed and v.buckets for v in verdicts)  # answered by the store, every one
    assert failures == 0
    assert connections <= 3  # the pool's two, and the one kept for /ready


@pytest.mark.parametrize("on_error", ["fail-closed", "fail-open"])
def test_a_call_that_waits_too_long_for_a_connection_is_not_a_store_failure(redis_url, on_error):
    """Redis holds the only connection's call (CLIENT PAUSE) past the others' `pool_timeout`:
    they are answered as `on_error` says (503 RateLimitStoreBusy, or admitted), and the breaker
    counts nothing: the store answered every call it got."""
    store = redis.Redis.from_url(redis_url)
    store.flushall()

    async def scenario() -> tuple[list, int, bool]:
        limiter = limiter_for(redis_url, max_connections=1, timeout=5, pool_timeout=0.2, on_error=on_error)
        await limiter.take(bucket(), 1)  # the script is loaded, the connection made
        store.client_pause(1000, all=False)  # writes (scripts) wait a second
        results = await asyncio.gather(*(limiter.take(bucket(), 1) for _ in range(3)), return_exceptions=True)
        await limiter.aclose()
        return results, limiter.breaker.failures, limiter.breaker.open

    results, failures, opened = asyncio.run(scenario())
    assert results[0].allowed and results[0].buckets  # waited for Redis, and got its answer
    if on_error == "fail-closed":
        assert [type(r) for r in results[1:]] == [ServiceUnavailable] * 2
        assert {r.code for r in results[1:]} == {"RateLimitStoreBusy"}
        assert {r.status for r in results[1:]} == {503}
    else:
        assert all(r.allowed and not r.buckets for r in results[1:])  # admitted unanswered
    assert failures == 0 and not opened
