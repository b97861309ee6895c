"""The limit stores call by call: budget reservations held, settled and let run out, and the
Redis store's connections under more calls than it holds (a real Redis)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
import redis

from gateway.config.settings import Budget, Price, RedisLimits
from gateway.core.errors import ServiceUnavailable
from gateway.policy.budgets import Account, accounts, period_bounds, reservation
from gateway.policy.limits import Bucket, MemoryLimiter
from gateway.policy.redis_limiter import RedisLimiter
from tests.support.redis_server import running_redis


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


def account(budget: float = 10) -> Account:
    return accounts("k", [Budget(tokens=int(budget), per="day")], time.time())[0]


def test_settling_after_a_flush_releases_nothing_and_adds_what_was_used(redis_url):
    """The same, one store call at a time: spent stays what answers used, never below zero."""
    store = redis.Redis.from_url(redis_url)
    store.flushall()

    async def scenario() -> list:
        limiter = limiter_for(redis_url)
        found = [account(10)]
        first, second = reservation(found, 4, None), reservation(found, 4, None)
        steps = [await limiter.reserve(first), await limiter.reserve(second)]
        steps.append(await limiter.reserve(reservation(found, 3, None)))  # 8 held: 3 more is past 10
        store.flushall()
        await limiter.settle(first, [0.0])  # failed: nothing used
        await limiter.settle(second, [2.0])
        late = reservation(found, 8, None)
        steps.append(await limiter.reserve(late))  # 2 spent + 8 fits 10
        steps.append(await limiter.reserve(reservation(found, 1, None)))
        await limiter.aclose()
        return steps

    first, second, past, fitted, full = asyncio.run(scenario())
    assert first is None and second is None and fitted is None
    assert past is not None and past[1] == 8.0
    assert full is not None and full[1] == 10.0  # 2 spent, 8 held


def test_an_older_chatgates_account_carries_over(redis_url):
    """A rolling upgrade: the plain number an older version kept is the new account's spend (and
    a negative one, the old refund bug's, counts as nothing)."""
    store = redis.Redis.from_url(redis_url)
    store.flushall()
    found = [account(10)]
    store.set(f"chatgate:limits:{found[0].name}", "7")

    async def scenario() -> list:
        limiter = limiter_for(redis_url)
        steps = [
            await limiter.reserve(reservation(found, 4, None)),
            await limiter.reserve(reservation(found, 3, None)),
        ]
        await limiter.aclose()
        return steps

    refused, admitted = asyncio.run(scenario())
    assert refused is not None and refused[1] == 7.0
    assert admitted is None
    store.flushall()
    store.set(f"chatgate:limits:{found[0].name}", "-50")

    async def after_bug() -> object:
        limiter = limiter_for(redis_url)
        result = await limiter.reserve(reservation(found, 11, None))
        await limiter.aclose()
        return result

    assert asyncio.run(after_bug())[1] == 0.0  # refused: 11 is past 10 however negative it was


def test_an_abandoned_reservation_is_not_renewed(redis_url):
    """A request dropped without settling (its reservation garbage) is let run out with its lease,
    not renewed for as long as the worker lives."""
    redis.Redis.from_url(redis_url).flushall()

    async def scenario() -> list:
        limiter = limiter_for(redis_url, reservation_lease=0.6)
        found = [account(10)]
        kept, dropped = reservation(found, 4, None), reservation(found, 4, None)
        assert await limiter.reserve(kept) is None and await limiter.reserve(dropped) is None
        del dropped
        await asyncio.sleep(2.0)  # three leases: `kept` renewed all along, `dropped` run out
        late = reservation(found, 6, None)
        steps = [await limiter.reserve(late)]
        await limiter.settle(kept, [4.0])
        steps.append(list(limiter.leased) == [late.id])
        await limiter.aclose()
        return steps

    fitted, only_the_live_one = asyncio.run(scenario())
    assert fitted is None  # 4 held + 6 fits 10: the dropped 4 no longer counts
    assert only_the_live_one


def test_the_memory_store_holds_and_settles_alike():
    async def scenario() -> list:
        limiter = MemoryLimiter()
        found = [account(10)]
        first = reservation(found, 6, None)
        steps = [await limiter.reserve(first), await limiter.reserve(reservation(found, 6, None))]
        await limiter.settle(first, [0.0])
        steps.append(await limiter.reserve(reservation(found, 10, None)))
        steps.append(await limiter.reserve(reservation(found, 1, None)))
        return steps

    held, refused, fitted, full = asyncio.run(scenario())
    assert held is None and fitted is None
    assert refused[1] == 6.0 and full[1] == 10.0


def test_a_probe_cancelled_midway_does_not_keep_the_breaker_open(redis_url):
    """Regression: the breaker's probe, cancelled (its client left) while Redis had not answered
    yet, left the breaker waiting for that probe's verdict for good: every later request got
    503 though Redis was back."""
    store = redis.Redis.from_url(redis_url)
    store.flushall()

    async def scenario() -> tuple[bool, bool]:
        limiter = limiter_for(redis_url, timeout=0.5, breaker={"failures": 1, "reset_after": 0.2})
        await limiter.take(bucket(), 1)  # the script is loaded, the connection made
        store.client_pause(3000, all=False)
        with pytest.raises(ServiceUnavailable):
            await limiter.take(bucket(), 1)  # times out: the breaker opens
        assert limiter.breaker.open
        await asyncio.sleep(0.3)
        probe = asyncio.ensure_future(limiter.take(bucket(), 1))
        await asyncio.sleep(0.1)  # the probe waits on the paused Redis
        probe.cancel()
        with pytest.raises(asyncio.CancelledError):
            await probe
        store.execute_command("CLIENT", "UNPAUSE")
        verdict = await limiter.take(bucket(), 1)  # Redis answers again: this call probes
        await limiter.aclose()
        return verdict.allowed, limiter.breaker.open

    allowed, still_open = asyncio.run(scenario())
    assert allowed and not still_open


def test_a_hard_budget_reserves_the_prompt_and_the_most_the_answer_may_generate():
    """A soft budget holds the prompt; a hard one the prompt and the completion bound, priced
    as output for a cost budget."""
    price = Price(input=2.0, output=10.0)
    found = accounts(
        "k",
        [
            Budget(tokens=1000, per="day"),
            Budget(tokens=1000, per="day", hard=True),
            Budget(cost=1.0, per="month", hard=True),
        ],
        time.time(),
    )
    held = reservation(found, 30, price, completion=200)
    assert held.amounts == [30, 230, pytest.approx((30 * 2.0 + 200 * 10.0) / 1e6)]


def next_midnight(now: float) -> float:
    return period_bounds("day", datetime.fromtimestamp(now, UTC))[1].timestamp()


@pytest.mark.parametrize("skew", ["a day ahead", "a day behind"])
def test_budget_periods_follow_redis_clock_not_the_gateways(redis_url, skew):
    """A gateway whose clock says another day than Redis's (skewed through its injectable clock)
    holds and spends in Redis's day: the store tells the script's time, the reservation moves to
    its period, and the next request reads the period on Redis's clock at once. A gateway with
    the right clock sees the same account."""
    store = redis.Redis.from_url(redis_url)
    store.flushall()
    seconds, micros = store.time()
    redis_now = seconds + micros / 1e6
    today = period_bounds("day", datetime.fromtimestamp(redis_now, UTC))[0]
    offset = (next_midnight(redis_now) - redis_now + 60) if skew == "a day ahead" else -86_400.0
    budget = [Budget(tokens=10, per="day")]

    async def scenario() -> tuple:
        skewed = RedisLimiter(RedisLimits(url=redis_url), clock=lambda: time.time() + offset)
        first = reservation(accounts("k", budget, skewed.now()), 6, None)
        wrong_day = first.accounts[0].starts
        assert await skewed.reserve(first) is None
        after = skewed.now()
        await skewed.settle(first, [6.0])
        right = RedisLimiter(RedisLimits(url=redis_url))
        refused = await right.reserve(reservation(accounts("k", budget, time.time()), 6, None))
        await skewed.aclose()
        await right.aclose()
        return wrong_day, first.accounts[0].starts, after, refused

    wrong_day, held_in, after, refused = asyncio.run(scenario())
    assert wrong_day != today  # the gateway's own clock named another day
    assert held_in == today  # Redis's day
    assert abs(after - time.time()) < 2  # the skew measured from Redis's answer
    assert refused is not None and refused[1] == 6.0  # the right clock sees the same account
    names = [name.decode() for name in store.scan_iter(match="*budget*:account")]
    assert names == [f"chatgate:limits:budget:k:tokens:day:{int(today.timestamp())}:account"]


def test_the_memory_store_starts_a_new_period_at_its_own_clock_s_midnight():
    """The memory store reads periods on this host's clock: a budget used up just before
    midnight admits again just after it, even for a reservation computed before it."""
    clock = [next_midnight(time.time()) - 1.0]
    budget = [Budget(tokens=10, per="day")]

    async def scenario() -> list:
        limiter = MemoryLimiter(clock=lambda: clock[0])
        spent = reservation(accounts("k", budget, limiter.now()), 10, None)
        steps = [await limiter.reserve(spent)]
        await limiter.settle(spent, [10.0])
        steps.append(await limiter.reserve(reservation(accounts("k", budget, limiter.now()), 1, None)))
        late = reservation(accounts("k", budget, limiter.now()), 1, None)  # read before midnight
        clock[0] += 2.0
        steps.append(await limiter.reserve(late))
        steps.append(late.accounts[0].starts.timestamp() == next_midnight(clock[0] - 2.0))
        return steps

    held, refused, next_day, moved = asyncio.run(scenario())
    assert held is None and refused is not None and refused[1] == 10.0
    assert next_day is None and moved
