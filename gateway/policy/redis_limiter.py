"""The limit store in Redis, shared by every gateway process and host.

One Lua script checks and takes every bucket of a request atomically, on Redis's clock; another
holds and settles budget reservations. Calls go through a breaker (a store that fails is not
waited on) and through `max_connections` slots: a worker with more calls at once than
connections queues them, and a call that waits too long for a slot is answered as `on_error`
says without counting against the store (a busy pool is not a failing store).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any

from gateway.config import RedisLimits
from gateway.core.errors import ServiceUnavailable
from gateway.policy.breaker import Breaker
from gateway.policy.limits import Bucket, Verdict, cost_of

if TYPE_CHECKING:
    from gateway.policy.budgets import Account

log = logging.getLogger("chatgate.limits")
READY_CHECK_SECONDS = 1.0
READY_PING_TIMEOUT = 0.5

# KEYS: bucket names. ARGV: mode ("take" | "charge"), then per bucket: capacity, cost.
# Returns: allowed (1/0), then each bucket's level after the call (as a string).
TAKE_SCRIPT = """
local now_parts = redis.call('TIME')
local now = tonumber(now_parts[1]) + tonumber(now_parts[2]) / 1000000
local mode = ARGV[1]
local levels = {}
local capacity_of = {}
local allowed = 1
for i, name in ipairs(KEYS) do
  local capacity = tonumber(ARGV[2 * i])
  capacity_of[i] = capacity
  local cost = tonumber(ARGV[2 * i + 1])
  local state = redis.call('HMGET', name, 'level', 'stamp')
  local level = tonumber(state[1]) or capacity
  local stamp = tonumber(state[2]) or now
  level = math.min(capacity, level + math.max(0, now - stamp) * capacity / 60)
  levels[i] = level
  if mode == 'take' and level < cost then allowed = 0 end
end
local result = {allowed}
for i, name in ipairs(KEYS) do
  local level = levels[i]
  if allowed == 1 then
    level = math.min(capacity_of[i], level - tonumber(ARGV[2 * i + 1]))
    redis.call('HSET', name, 'level', tostring(level), 'stamp', tostring(now))
    redis.call('EXPIRE', name, 120)
  end
  result[i + 1] = tostring(level)
end
return result
"""

# KEYS: budget accounts. ARGV: mode ("reserve" | "settle"), then per account: budget, amount, ttl.
# Returns {0} when done, or {i, spent} when account i would go past its budget (nothing added).
BUDGET_SCRIPT = """
local mode = ARGV[1]
if mode == 'reserve' then
  for i, name in ipairs(KEYS) do
    local budget = tonumber(ARGV[3 * i - 1])
    local amount = tonumber(ARGV[3 * i])
    local spent = tonumber(redis.call('GET', name)) or 0
    if amount > 0 and spent + amount > budget then return {i, tostring(spent)} end
  end
end
for i, name in ipairs(KEYS) do
  redis.call('INCRBYFLOAT', name, ARGV[3 * i])
  redis.call('EXPIRE', name, tonumber(ARGV[3 * i + 1]))
end
return {0}
"""


def budget_argv(mode: str, accounts: list[Account], amounts: list[float]) -> list[str | int | float]:
    argv: list[str | int | float] = [mode]
    for account, amount in zip(accounts, amounts, strict=True):
        argv += [account.budget.amount, repr(float(amount)), account.ttl]
    return argv


class RedisLimiter:
    def __init__(self, settings: RedisLimits) -> None:
        import redis.asyncio as redis

        # one connection more than the slots: the /ready ping never waits behind requests
        self.client = redis.Redis.from_url(
            settings.url,
            socket_connect_timeout=settings.timeout,
            socket_timeout=settings.timeout,
            max_connections=settings.max_connections + 1,
        )
        self.slots = asyncio.Semaphore(settings.max_connections)
        self.pool_timeout = settings.pool_timeout
        self.script = self.client.register_script(TAKE_SCRIPT)
        self.budget_script = self.client.register_script(BUDGET_SCRIPT)
        self.prefix = settings.prefix
        self.fail_open = settings.on_error == "fail-open"
        mode = "fail-open: admitting" if self.fail_open else "fail-closed: refusing"
        self.breaker = Breaker(
            f"rate-limit store ({mode} while it is away)",
            settings.breaker.failures,
            settings.breaker.reset_after,
        )
        self.checked_at = -READY_CHECK_SECONDS
        self.answered = False

    async def run(self, mode: str, buckets: list[Bucket], costs: list[int]) -> list[bytes] | None:
        """The take script's answer; None when the store cannot answer and the gateway fails open."""
        argv: list[str | int | float] = [mode]
        for bucket, cost in zip(buckets, costs, strict=True):
            argv += [bucket.capacity, cost]
        return await self.call(self.script, [self.prefix + b.name for b in buckets], argv)

    async def call(self, script: Any, keys: list[str], argv: list[str | int | float]) -> Any:
        """A script's answer; None when the store cannot answer and the gateway fails open
        (fail-closed: 503). Only the store's own failures count against it in the breaker."""
        import redis.exceptions

        if not self.slots.locked():
            await self.slots.acquire()  # a connection is free: no wait, no timer
        else:
            try:
                async with asyncio.timeout(self.pool_timeout):
                    await self.slots.acquire()
            except TimeoutError:
                return self.unanswered(busy=True)
        try:
            if self.breaker.allows():
                try:
                    result = await script(keys=keys, args=argv)
                except redis.exceptions.MaxConnectionsError:
                    return self.unanswered(busy=True)  # the slots prevent it; never a failure
                except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as error:
                    self.breaker.failed(error)
                else:
                    self.breaker.succeeded()
                    return result
        finally:
            self.slots.release()
        return self.unanswered(busy=False)

    def unanswered(self, busy: bool) -> None:
        """What a call the store did not answer gets: None (fail-open), or 503 (fail-closed)."""
        if self.fail_open:
            return None
        if busy:
            raise ServiceUnavailable(
                "The rate-limit store is busy; try again shortly.",
                code="RateLimitStoreBusy",
                headers={"Retry-After": "1"},
            )
        raise ServiceUnavailable(
            "The rate-limit store is unreachable; try again shortly.",
            code="RateLimitStoreUnavailable",
            headers={"Retry-After": str(max(1, round(self.breaker.reset_after)))},
        )

    async def take(self, buckets: list[Bucket], tokens: int) -> Verdict:
        costs = [cost_of(b, tokens) for b in buckets]
        result = await self.run("take", buckets, costs)
        if result is None:
            return Verdict(True, [], [], [])  # fail-open: admitted, nothing to report
        allowed = int(result[0]) == 1
        levels = [float(x) for x in result[1:]]
        if allowed:
            return Verdict(True, buckets, levels, costs)
        return Verdict(False, buckets, levels, costs)

    async def charge(self, buckets: list[Bucket], tokens: int) -> None:
        """Best effort: the answer is already made; a store that cannot count it now must not
        turn it into an error (the breaker has logged the outage)."""
        token_buckets = [b for b in buckets if b.kind == "tokens"]
        if token_buckets and tokens:
            with contextlib.suppress(ServiceUnavailable):
                await self.run("charge", token_buckets, [tokens] * len(token_buckets))

    async def reserve(self, accounts: list[Account], amounts: list[float]) -> tuple[Account, float] | None:
        result = await self.call(
            self.budget_script,
            [self.prefix + a.name for a in accounts],
            budget_argv("reserve", accounts, amounts),
        )
        if result is None or int(result[0]) == 0:
            return None  # reserved (or the store is away and the gateway fails open)
        return accounts[int(result[0]) - 1], float(result[1])

    async def settle(self, accounts: list[Account], amounts: list[float]) -> None:
        """Best effort, like `charge`."""
        with contextlib.suppress(ServiceUnavailable):
            await self.call(
                self.budget_script,
                [self.prefix + a.name for a in accounts],
                budget_argv("settle", accounts, amounts),
            )

    async def reachable(self) -> bool:
        """A PING, at most one a second however often /ready is asked (none while the breaker
        is open: the store is not answering)."""
        if self.breaker.open:
            return False
        now = time.monotonic()
        if now - self.checked_at >= READY_CHECK_SECONDS:
            self.checked_at = now
            try:
                self.answered = bool(await asyncio.wait_for(self.client.ping(), READY_PING_TIMEOUT))
            except (TimeoutError, OSError, Exception):  # any failure to answer is "not reachable"
                self.answered = False
        return self.answered

    async def aclose(self) -> None:
        await self.client.aclose()
