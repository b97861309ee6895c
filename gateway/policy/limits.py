"""Rate limits: token buckets for requests/min and tokens/min, per key and per deployment.

Two stores behind one interface: `MemoryLimiter` (one process; the event loop makes each
call atomic) and `RedisLimiter` (many processes or hosts; one Lua script checks and takes
every bucket of a request atomically, on Redis's clock). A bucket holds `capacity` units and
refills continuously at capacity/60 per second, so exactly `capacity` requests fit in a burst.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from gateway.config import Limits, RateLimiting, RedisLimits
from gateway.core.errors import ServiceUnavailable, TooManyRequests
from gateway.policy.breaker import Breaker

if TYPE_CHECKING:
    from gateway.policy.budgets import Account

log = logging.getLogger("chatgate.limits")
WINDOW_SECONDS = 60.0
READY_CHECK_SECONDS = 1.0
READY_PING_TIMEOUT = 0.5


@dataclass(frozen=True, slots=True)
class Bucket:
    name: str  # e.g. "key:team-a:requests"
    kind: str  # "requests" | "tokens"
    capacity: int
    per_second: float = field(init=False)  # the refill rate

    def __post_init__(self) -> None:
        object.__setattr__(self, "per_second", self.capacity / WINDOW_SECONDS)


@dataclass(frozen=True, slots=True)
class Verdict:
    """What a take found: whether it was allowed, and each bucket's level after it."""

    allowed: bool
    buckets: list[Bucket]
    levels: list[float]  # after taking, if allowed; as found, if not
    costs: list[int]

    @property
    def retry_after(self) -> float:
        """Seconds until every bucket has room for its cost (0 when allowed)."""
        if self.allowed:
            return 0.0
        return max(
            (min(cost, b.capacity) - level) / b.per_second
            for b, level, cost in zip(self.buckets, self.levels, self.costs, strict=True)
        )

    def short_kinds(self) -> set[str]:
        return {b.kind for b, level in zip(self.buckets, self.levels, strict=True) if level < 1}


def buckets_for(subject: str, limits: Limits) -> list[Bucket]:
    found = []
    if limits.requests_per_minute:
        found.append(Bucket(f"{subject}:requests", "requests", limits.requests_per_minute))
    if limits.tokens_per_minute:
        found.append(Bucket(f"{subject}:tokens", "tokens", limits.tokens_per_minute))
    return found


def cost_of(bucket: Bucket, tokens: int) -> int:
    return 1 if bucket.kind == "requests" else tokens


RATE_HEADER_NAMES = {
    kind: tuple(f"x-ratelimit-{part}-{kind}".encode() for part in ("limit", "remaining", "reset"))
    for kind in ("requests", "tokens")
}
RawHeaders = list[tuple[bytes, bytes]]


def rate_headers(verdict: Verdict) -> RawHeaders:
    """OpenAI-style x-ratelimit-* headers from the tightest bucket of each kind, as the raw
    (name, value) pairs a response sends: they go out with every admitted request."""
    tightest: dict[str, tuple[float, Bucket]] = {}
    for bucket, level in zip(verdict.buckets, verdict.levels, strict=True):
        found = tightest.get(bucket.kind)
        if found is None or level < found[0]:
            tightest[bucket.kind] = (level, bucket)
    raw: RawHeaders = []
    for kind, (limit, remaining, reset) in RATE_HEADER_NAMES.items():
        if kind in tightest:
            level, bucket = tightest[kind]
            raw.append((limit, b"%d" % bucket.capacity))
            raw.append((remaining, b"%d" % math.floor(level) if level > 0 else b"0"))
            raw.append((reset, b"%ds" % math.ceil((bucket.capacity - level) / bucket.per_second)))
    return raw


def limited_kinds(verdict: Verdict) -> str:
    """Which limits refused: "requests", "tokens" or "requests and tokens"."""
    kinds = sorted(verdict.short_kinds() or {"requests"})
    return " and ".join(kinds)


def refused(verdict: Verdict) -> TooManyRequests:
    retry_after = max(1, math.ceil(verdict.retry_after))
    return TooManyRequests(
        f"Rate limit reached for {limited_kinds(verdict)}; retry after {retry_after} seconds.",
        code="RateLimitExceeded",
        headers={"Retry-After": str(retry_after)}
        | {name.decode(): value.decode() for name, value in rate_headers(verdict)},
    )


class Limiter(Protocol):
    async def take(self, buckets: list[Bucket], tokens: int) -> Verdict:
        """Take one request and `tokens` from every bucket, or nothing if any lacks room."""
        ...

    async def charge(self, buckets: list[Bucket], tokens: int) -> None:
        """Take `tokens` more from the token buckets, room or not (completion tokens, and the
        prompt's correction); negative gives back, up to the capacity."""
        ...

    async def reserve(self, accounts: list[Account], amounts: list[float]) -> tuple[Account, float] | None:
        """Add `amounts` to every budget account, or to none if one would go past its budget:
        then (that account, what it has spent)."""
        ...

    async def settle(self, accounts: list[Account], amounts: list[float]) -> None:
        """Add (or, negative, give back) `amounts`, whatever the budgets say."""
        ...

    async def reachable(self) -> bool:
        """Whether the store answers now (for /ready)."""
        ...

    async def aclose(self) -> None: ...


class MemoryLimiter:
    def __init__(self) -> None:
        self.levels: dict[str, tuple[float, float]] = {}  # bucket name → (level, when)
        self.budgets: dict[str, tuple[float, float]] = {}  # account name → (spent, forgotten at)

    def level(self, bucket: Bucket, now: float) -> float:
        state = self.levels.get(bucket.name)
        if state is None:
            return bucket.capacity
        level = state[0] + (now - state[1]) * bucket.per_second
        return level if level < bucket.capacity else bucket.capacity

    async def take(self, buckets: list[Bucket], tokens: int) -> Verdict:
        now = time.monotonic()
        stored = self.levels
        levels: list[float] = []
        costs: list[int] = []
        allowed = True
        for bucket in buckets:  # one pass, no calls: this runs on every request
            state = stored.get(bucket.name)
            level: float = bucket.capacity
            if state is not None:
                level = min(level, state[0] + (now - state[1]) * bucket.per_second)
            cost = 1 if bucket.kind == "requests" else tokens
            allowed = allowed and level >= cost
            levels.append(level)
            costs.append(cost)
        if allowed:
            for index, bucket in enumerate(buckets):
                levels[index] -= costs[index]
                stored[bucket.name] = (levels[index], now)
        return Verdict(allowed, buckets, levels, costs)

    async def charge(self, buckets: list[Bucket], tokens: int) -> None:
        now = time.monotonic()
        for bucket in buckets:
            if bucket.kind == "tokens":
                self.levels[bucket.name] = (min(bucket.capacity, self.level(bucket, now) - tokens), now)

    async def reserve(self, accounts: list[Account], amounts: list[float]) -> tuple[Account, float] | None:
        now = time.time()
        spent = [self.spent(account, now) for account in accounts]
        for account, already, amount in zip(accounts, spent, amounts, strict=True):
            if amount > 0 and already + amount > account.budget.amount:
                return account, already
        await self.settle(accounts, amounts)
        return None

    async def settle(self, accounts: list[Account], amounts: list[float]) -> None:
        now = time.time()
        for account, amount in zip(accounts, amounts, strict=True):
            self.budgets[account.name] = (self.spent(account, now) + amount, now + account.ttl)

    def spent(self, account: Account, now: float) -> float:
        found = self.budgets.get(account.name)
        return 0.0 if found is None or found[1] < now else found[0]

    async def reachable(self) -> bool:
        return True

    async def aclose(self) -> None:
        return None


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

        self.client = redis.Redis.from_url(
            settings.url, socket_connect_timeout=settings.timeout, socket_timeout=settings.timeout
        )
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
        return await self.call(self.script, [b.name for b in buckets], argv)

    async def call(self, script: Any, names: list[str], argv: list[str | int | float]) -> list[bytes] | None:
        """A script's answer, through the breaker; None when the store cannot answer and the
        gateway fails open (fail-closed: 503)."""
        import redis.exceptions

        if self.breaker.allows():
            try:
                result = await script(keys=[self.prefix + name for name in names], args=argv)
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as error:
                self.breaker.failed(error)
            else:
                self.breaker.succeeded()
                return result
        if self.fail_open:
            return None
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
            self.budget_script, [a.name for a in accounts], budget_argv("reserve", accounts, amounts)
        )
        if result is None or int(result[0]) == 0:
            return None  # reserved (or the store is away and the gateway fails open)
        return accounts[int(result[0]) - 1], float(result[1])

    async def settle(self, accounts: list[Account], amounts: list[float]) -> None:
        """Best effort, like `charge`."""
        with contextlib.suppress(ServiceUnavailable):
            await self.call(
                self.budget_script, [a.name for a in accounts], budget_argv("settle", accounts, amounts)
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


def create_limiter(settings: RateLimiting) -> Limiter:
    if settings.store == "redis" and settings.redis is not None:
        return RedisLimiter(settings.redis)
    return MemoryLimiter()
