"""The limit store in Redis, shared by every gateway process and host.

One Lua script checks and takes every bucket of a request atomically, on Redis's clock; another
holds and settles budget reservations. Calls go through a breaker (a store that fails is not
waited on) and through `max_connections` slots: a worker with more calls at once than
connections queues them, and a call that waits too long for a slot is answered as `on_error`
says without counting against the store (a busy pool is not a failing store). Each budget
reservation is a lease that this worker renews while its request runs, so the reservations of
a gateway that died stop counting within `reservation_lease` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gateway.config.settings import RedisLimits
from gateway.core.errors import ServiceUnavailable
from gateway.policy.breaker import Breaker
from gateway.policy.limits import Bucket, Verdict, cost_of

if TYPE_CHECKING:
    from gateway.policy.budgets import Account, Reservation

log = logging.getLogger("chatgate.limits")
OWED_MOST = 100_000  # budget usages kept for a store that is away; past it they go unrecorded
READY_CHECK_SECONDS = 1.0
READY_PING_TIMEOUT = 0.5
PERIOD_ATTEMPTS = 3  # reservations asked for again when Redis's clock was in another budget period

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

# KEYS, per budget account: its hash (`spent`; `held`, the sum of its reservations; and each
# reservation's amount under 'r:' .. id), its leases (a sorted set: reservation id → when it
# stops counting), and the plain number an older chatgate kept instead (its spend carries over).
# ARGV: mode ("reserve" | "settle"), reservation id, lease seconds; per account: budget, amount,
# when the store may forget it, its period's start and end (epoch seconds).
# reserve: {0, now} when held; {i, spent and held, now} when account i would go past its budget
# (nothing held); {-1, now} when Redis's clock is outside an account's period (the gateway's
# clock is off, or the period just ended): nothing held, the gateway asks again for the period
# holding `now`. settle: the reservation is released (where the store still has it) and `amount`
# spent. Sums are kept in Lua and written back whole (%.17g keeps a double exact); `held` never
# goes below zero, and a sum under 1e-9 (the dust of float sums) is zero.
BUDGET_SCRIPT = """
local now_parts = redis.call('TIME')
local now = tonumber(now_parts[1]) + tonumber(now_parts[2]) / 1000000
local clock = string.format('%.6f', now)
local mode, id, lease = ARGV[1], ARGV[2], tonumber(ARGV[3])
local count = #KEYS / 3

local function number(value) return string.format('%.17g', value) end
local function tidy(held) if held < 1e-9 then return 0 end return held end
local function arg(i, field) return ARGV[3 + 5 * (i - 1) + field] end

if mode == 'reserve' then
  for i = 1, count do
    if now < tonumber(arg(i, 4)) or now >= tonumber(arg(i, 5)) then return {-1, clock} end
  end
  local states = {}
  for i = 1, count do
    local account, leases = KEYS[3 * i - 2], KEYS[3 * i - 1]
    local state = redis.call('HMGET', account, 'spent', 'held')
    local spent, held = tonumber(state[1]), tonumber(state[2]) or 0
    if spent == nil and not state[2] then
      spent = math.max(0, tonumber(redis.call('GET', KEYS[3 * i])) or 0)
    end
    spent = spent or 0
    local stale = redis.call('ZRANGEBYSCORE', leases, '-inf', now)
    if #stale > 0 then
      local fields = {}
      for j, lapsed in ipairs(stale) do fields[j] = 'r:' .. lapsed end
      for _, amount in ipairs(redis.call('HMGET', account, unpack(fields))) do
        held = held - (tonumber(amount) or 0)
      end
      redis.call('HDEL', account, unpack(fields))
      redis.call('ZREMRANGEBYSCORE', leases, '-inf', now)
      held = tidy(held)
    end
    local amount = tonumber(arg(i, 2))
    if amount > 0 and spent + held + amount > tonumber(arg(i, 1)) then
      if #stale > 0 then redis.call('HSET', account, 'held', number(held)) end
      return {i, tostring(spent + held), clock}
    end
    states[i] = {spent, held + amount}
  end
  for i = 1, count do
    local account, leases, forget_at = KEYS[3 * i - 2], KEYS[3 * i - 1], arg(i, 3)
    local spent, held = states[i][1], states[i][2]
    redis.call('HSET', account, 'r:' .. id, arg(i, 2), 'held', number(held), 'spent', number(spent))
    redis.call('ZADD', leases, now + lease, id)
    redis.call('EXPIREAT', account, forget_at)
    redis.call('EXPIREAT', leases, forget_at)
  end
  return {0, clock}
end
for i = 1, count do
  local account, leases, used = KEYS[3 * i - 2], KEYS[3 * i - 1], tonumber(arg(i, 2))
  local state = redis.call('HMGET', account, 'r:' .. id, 'held', 'spent')
  local amount, held, spent = tonumber(state[1]), tonumber(state[2]) or 0, tonumber(state[3]) or 0
  if amount ~= nil then
    redis.call('HDEL', account, 'r:' .. id)
    redis.call('ZREM', leases, id)
    held = tidy(held - amount)
  end
  redis.call('HSET', account, 'held', number(held), 'spent', number(spent + math.max(0, used)))
  redis.call('EXPIREAT', account, arg(i, 3))
end
return {0, clock}
"""

# KEYS: lease sets. ARGV: lease seconds, then per set: how many reservation ids, the ids.
# A lease the store no longer has (released, or flushed) is not made again (ZADD XX).
RENEW_SCRIPT = """
local now_parts = redis.call('TIME')
local expiry = tonumber(now_parts[1]) + tonumber(now_parts[2]) / 1000000 + tonumber(ARGV[1])
local at = 2
for _, leases in ipairs(KEYS) do
  local count = tonumber(ARGV[at])
  for j = at + 1, at + count do redis.call('ZADD', leases, 'XX', expiry, ARGV[j]) end
  at = at + count + 1
end
return 0
"""


class RedisLimiter:
    """`clock`: this host's time; `offset`: how far Redis's TIME is from it, as its last answer
    said (budget periods are read on Redis's clock, the same for every gateway)."""

    def __init__(self, settings: RedisLimits, clock: Callable[[], float] = time.time) -> None:
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
        self.renew_script = self.client.register_script(RENEW_SCRIPT)
        self.prefix = settings.prefix
        self.lease = settings.reservation_lease
        self.fail_open = settings.on_error == "fail-open"
        mode = "fail-open: admitting" if self.fail_open else "fail-closed: refusing"
        self.breaker = Breaker(
            f"rate-limit store ({mode} while it is away)",
            settings.breaker.failures,
            settings.breaker.reset_after,
        )
        self.checked_at = -READY_CHECK_SECONDS
        self.answered = False
        # held in the store by this worker and renewed while their requests hold them: one that
        # a request dropped without settling (garbage now) is let run out with its lease
        self.leased: weakref.WeakValueDictionary[str, Reservation] = weakref.WeakValueDictionary()
        self.renewing: asyncio.Task[None] | None = None
        self.clock = clock
        self.offset = 0.0
        # budget usage the store did not take while it was away (fail-open serves on), recorded
        # once it answers again: a budget's account says what was spent, outage or not
        self.owed: deque[tuple[Reservation, list[float]]] = deque()
        self.owed_dropped = 0
        self.paying: asyncio.Task[None] | None = None

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
                    self.breaker.untold()  # the slots prevent it; never a failure
                    return self.unanswered(busy=True)
                except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as error:
                    self.breaker.failed(error)
                except BaseException:  # cancelled: its client left
                    self.breaker.untold()
                    raise
                else:
                    self.breaker.succeeded()
                    if self.owed and self.paying is None:
                        self.paying = asyncio.get_running_loop().create_task(self.pay_owed())
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

    async def budget_call(self, mode: str, reservation: Reservation, amounts: list[float]) -> Any:
        keys: list[str] = []
        argv: list[str | int | float] = [mode, reservation.id, self.lease]
        for account, amount in zip(reservation.accounts, amounts, strict=True):
            name = self.prefix + account.name
            keys += [f"{name}:account", f"{name}:leases", name]
            argv += [
                account.budget.amount,
                repr(float(amount)),
                math.ceil(account.forgotten_at),
                int(account.starts.timestamp()),
                int(account.resets.timestamp()),
            ]
        result = await self.call(self.budget_script, keys, argv)
        if result is not None:  # every answer tells Redis's time: the next period read follows it
            self.offset = float(result[-1]) - self.clock()
        return result

    async def reserve(self, reservation: Reservation) -> tuple[Account, float] | None:
        for _ in range(PERIOD_ATTEMPTS):
            result = await self.budget_call("reserve", reservation, reservation.amounts)
            if result is None:
                return None  # the store is away and the gateway fails open: nothing held
            if int(result[0]) != -1:
                break
            # Redis's clock is in another period than this gateway thought: hold in that one
            store_now = float(result[1])
            reservation.accounts = [account.moved_to(store_now) for account in reservation.accounts]
        else:
            raise ServiceUnavailable(
                "The rate-limit store's clock keeps moving between budget periods; try again.",
                code="RateLimitStoreBusy",
                headers={"Retry-After": "1"},
            )
        if int(result[0]) != 0:
            return reservation.accounts[int(result[0]) - 1], float(result[1])
        self.leased[reservation.id] = reservation
        if self.renewing is None:
            self.renewing = asyncio.get_running_loop().create_task(self.renew_leases())
        return None

    async def settle(self, reservation: Reservation, used: list[float]) -> None:
        """Never an error, like `charge`: what the store cannot take now is owed, and recorded
        once it answers again (a reservation it cannot release runs out with its lease)."""
        self.leased.pop(reservation.id, None)
        answered = None
        with contextlib.suppress(ServiceUnavailable):
            answered = await self.budget_call("settle", reservation, used)
        if answered is None and any(used):
            self.owe(reservation, used)

    def owe(self, reservation: Reservation, used: list[float]) -> None:
        if len(self.owed) >= OWED_MOST:
            self.owed_dropped += 1
            if self.owed_dropped == 1:
                log.error(
                    "rate-limit store: %d usages are owed to it already; more are not recorded",
                    OWED_MOST,
                )
            return
        self.owed.append((reservation, used))

    async def pay_owed(self) -> None:
        """The usage owed since the store went away, recorded in order until it is all taken or
        the store is away again (then the rest waits for its return)."""
        paid = 0
        try:
            while self.owed:
                reservation, used = self.owed[0]
                answered = None
                with contextlib.suppress(ServiceUnavailable):
                    answered = await self.budget_call("settle", reservation, used)
                if answered is None:
                    break
                self.owed.popleft()
                paid += 1
        finally:
            self.paying = None
            if paid:
                dropped, self.owed_dropped = self.owed_dropped, 0
                log.warning(
                    "rate-limit store: recorded %d budget usages served while it was away%s",
                    paid,
                    f"; {dropped} more were not (over {OWED_MOST} owed)" if dropped else "",
                )

    async def renew_leases(self) -> None:
        """Every third of a lease, one call renews the leases of every reservation this worker
        holds, until it holds none."""
        try:
            while True:
                await asyncio.sleep(self.lease / 3)
                if not self.leased:
                    return
                by_set: dict[str, list[str]] = {}
                for reservation in list(self.leased.values()):
                    for account in reservation.accounts:
                        by_set.setdefault(f"{self.prefix}{account.name}:leases", []).append(reservation.id)
                argv: list[str | int | float] = [self.lease]
                for ids in by_set.values():
                    argv += [len(ids), *ids]
                try:
                    await self.call(self.renew_script, list(by_set), argv)
                except ServiceUnavailable:
                    pass  # the breaker has logged it; the next round tries again
                except Exception:  # this loop must outlive a surprise, or leases would lapse
                    log.exception("renewing budget reservations failed")
        finally:
            self.renewing = None

    def now(self) -> float:
        return self.clock() + self.offset

    def where(self) -> str:
        """The store's address without its credentials (the URL may hold a password)."""
        found = self.client.connection_pool.connection_kwargs
        if "path" in found:
            return f"unix:{found['path']}"
        return f"{found.get('host', 'localhost')}:{found.get('port', 6379)}/{found.get('db', 0)}"

    async def started(self) -> tuple[int, str] | None:
        """Ask Redis its time once: the line says whether it answered (and how far its clock is
        from this host's), or that it did not and what requests get until it does."""
        try:
            seconds, micros = await asyncio.wait_for(self.client.time(), READY_PING_TIMEOUT * 4)
        except Exception as error:  # any failure to answer is "cannot be reached"
            until = (
                "requests are admitted without limits or budgets (on_error: fail-open)"
                if self.fail_open
                else "requests are refused with 503 (on_error: fail-closed)"
            )
            return logging.WARNING, (
                f"Redis for limits and budgets at {self.where()} cannot be reached "
                f"({type(error).__name__}); until it answers, {until}"
            )
        self.offset = seconds + micros / 1e6 - self.clock()
        return logging.INFO, (
            f"Redis for limits and budgets at {self.where()} answers; budget periods follow its "
            f"clock ({self.offset:+.3f} s from this host's)"
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
        if self.renewing is not None:
            self.renewing.cancel()
        await self.client.aclose()
