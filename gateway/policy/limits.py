"""Rate limits: token buckets for requests/min and tokens/min, per key and per deployment.

Two stores behind one interface, `Limiter`: `MemoryLimiter` here (one process; the event loop
makes each call atomic) and `RedisLimiter` (gateway/policy/redis_limiter.py: many processes or
hosts). A bucket holds `capacity` units and refills continuously at capacity/60 per second, so
exactly `capacity` requests fit in a burst. The store also holds the budgets' accounts
(gateway/policy/budgets.py).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from gateway.config.settings import Limits
from gateway.core.errors import TooManyRequests

if TYPE_CHECKING:
    from gateway.policy.budgets import Account, Reservation

WINDOW_SECONDS = 60.0


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


def too_large(verdict: Verdict) -> TooManyRequests | None:
    """The refusal of a request whose tokens are more than a token limit holds at all: no wait
    lets it through, so it is told so (OpenAI's own words, as a 429 without Retry-After) rather
    than to retry. None when every cost fits its bucket's capacity."""
    for bucket, cost in zip(verdict.buckets, verdict.costs, strict=True):
        if bucket.kind == "tokens" and cost > bucket.capacity:
            kind, subject = bucket.name.removesuffix(":tokens").split(":", 1)
            return TooManyRequests(
                f"Request too large for {kind} '{subject}' on tokens per min (TPM): Limit "
                f"{bucket.capacity}, Requested {cost}. The input or output tokens must be reduced "
                "in order to run successfully.",
                code="RequestTooLarge",
                headers={name.decode(): value.decode() for name, value in rate_headers(verdict)},
            )
    return None


class Limiter(Protocol):
    async def take(self, buckets: list[Bucket], tokens: int) -> Verdict:
        """Take one request and `tokens` from every bucket, or nothing if any lacks room."""
        ...

    async def charge(self, buckets: list[Bucket], tokens: int) -> None:
        """Take `tokens` more from the token buckets, room or not (completion tokens, and the
        prompt's correction); negative gives back, up to the capacity."""
        ...

    async def reserve(self, reservation: Reservation) -> tuple[Account, float] | None:
        """Hold the reservation's amounts against every account, or nothing if one would go past
        its budget: then (that account, what it has spent and holds). An account of a period the
        store's clock is not in is moved to the one it is in (`reservation.accounts` replaced)."""
        ...

    async def settle(self, reservation: Reservation, used: list[float]) -> None:
        """Release the reservation and add what the answer `used` of each account, whatever the
        budgets say (called once per reservation)."""
        ...

    def now(self) -> float:
        """The store's time (epoch seconds), as best known: what budget periods follow."""
        ...

    async def reachable(self) -> bool:
        """Whether the store answers now (for /ready)."""
        ...

    async def started(self) -> tuple[int, str] | None:
        """What the log says of the store at start, and at which level (where it is, whether it
        answers, what the gateway does while it does not); None: nothing to say."""
        ...

    async def aclose(self) -> None: ...


@dataclass(slots=True)
class MemoryAccount:
    """A budget account in memory: what was spent, and what admissions hold until settled."""

    forgotten_at: float  # the period is over: a new account starts
    spent: float = 0.0
    held: dict[str, float] = field(default_factory=dict)  # reservation id → amount
    held_total: float = 0.0


class MemoryLimiter:
    """Every counter in this process. A reservation lives until it is settled: the store cannot
    outlive the gateway that holds it, so it needs no lease. Budget periods follow `clock`
    (this host's)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.levels: dict[str, tuple[float, float]] = {}  # bucket name → (level, when)
        self.accounts: dict[str, MemoryAccount] = {}  # budget account name → its state
        self.clock = clock

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

    def account(self, account: Account, now: float) -> MemoryAccount:
        found = self.accounts.get(account.name)
        if found is None or found.forgotten_at < now:
            found = self.accounts[account.name] = MemoryAccount(account.forgotten_at)
        return found

    async def reserve(self, reservation: Reservation) -> tuple[Account, float] | None:
        now = self.clock()
        if not all(account.in_period(now) for account in reservation.accounts):
            reservation.accounts = [account.moved_to(now) for account in reservation.accounts]
        states = [self.account(account, now) for account in reservation.accounts]
        for account, state, amount in zip(reservation.accounts, states, reservation.amounts, strict=True):
            spent = state.spent + state.held_total
            if amount > 0 and spent + amount > account.budget.amount:
                return account, spent
        for state, amount in zip(states, reservation.amounts, strict=True):
            state.held[reservation.id] = amount
            state.held_total += amount
        return None

    async def settle(self, reservation: Reservation, used: list[float]) -> None:
        now = self.clock()
        for account, amount in zip(reservation.accounts, used, strict=True):
            state = self.account(account, now)
            held = state.held.pop(reservation.id, None)
            if held is not None:  # a sum of floats: exact zero once nothing is held
                state.held_total = state.held_total - held if state.held else 0.0
            state.spent += max(0.0, amount)

    def now(self) -> float:
        return self.clock()

    async def reachable(self) -> bool:
        return True

    async def started(self) -> tuple[int, str] | None:
        return None  # this process's memory: always there

    async def aclose(self) -> None:
        return None
