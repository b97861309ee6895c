"""Budgets: how much a key may use per calendar day, week or month (UTC), in tokens or in cost.

At admission the request's estimated prompt is reserved against every budget of its key, in the
rate-limit store, atomically (the store refuses when a budget would go past its amount). The
reservation is held apart from what was spent: settling it releases it and adds what the answer
used (nothing, for an answer that failed), so an account never goes below zero, even when the
store lost the reservation meanwhile. In Redis a reservation is a lease its gateway renews while
the request runs: one whose gateway died stops counting when the lease runs out. A refused
request gets 429 saying which budget and when it resets.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from gateway.config import Budget, Price
from gateway.core.canonical import Usage
from gateway.core.errors import TooManyRequests

PERIOD_WORDS = {"day": "a day", "week": "a week", "month": "a month"}


def period_bounds(per: str, now: datetime) -> tuple[datetime, datetime]:
    """The UTC calendar period holding `now`: (its start, the next one's start). Weeks start Monday."""
    day = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    if per == "day":
        return day, day + timedelta(days=1)
    if per == "week":
        start = day - timedelta(days=day.weekday())
        return start, start + timedelta(days=7)
    start = day.replace(day=1)
    following = (
        start.replace(year=start.year + 1, month=1)
        if start.month == 12
        else start.replace(month=start.month + 1)
    )
    return start, following


@dataclass(frozen=True, slots=True)
class Account:
    """One budget of one key in the current period: its name in the store and its amount."""

    key: str
    budget: Budget
    starts: datetime
    resets: datetime

    @property
    def name(self) -> str:
        return f"budget:{self.key}:{self.budget.measure}:{self.budget.per}:{int(self.starts.timestamp())}"

    @property
    def ttl(self) -> int:
        """Seconds the store keeps the account: past the period, a little."""
        return max(60, math.ceil((self.resets - datetime.now(UTC)).total_seconds()) + 3600)

    def spend(
        self, tokens: float, price: Price | None, prompt: float = 0.0, completion: float = 0.0
    ) -> float:
        """What `tokens` (or a prompt/completion split) cost against this budget."""
        if self.budget.measure == "tokens":
            return tokens
        if price is None:
            return 0.0
        return (prompt * price.input + completion * price.output) / 1_000_000


def accounts(key: str, budgets: list[Budget], now: datetime | None = None) -> list[Account]:
    now = now or datetime.now(UTC)
    return [Account(key, b, *period_bounds(b.per, now)) for b in budgets]


@dataclass(slots=True, weakref_slot=True)
class Reservation:
    """What admission holds against a key's accounts until the answer settles it, once, to what it
    used. `id` names it in the store; the amount held may be any estimate (the prompt today)."""

    accounts: list[Account]
    amounts: list[float]
    id: str = field(default_factory=lambda: secrets.token_hex(8))
    settled: bool = False


def reservation(found: list[Account], prompt_tokens: int, price: Price | None) -> Reservation:
    """What admission reserves against each account: the estimated prompt."""
    return Reservation(found, [a.spend(prompt_tokens, price, prompt=prompt_tokens) for a in found])


def used(found: list[Account], usage: Usage | None, price: Price | None) -> list[float]:
    """What an answer used of each account: nothing when it ended without a usage (it failed)."""
    if usage is None:
        return [0.0] * len(found)
    return [a.spend(usage.total_tokens, price, usage.prompt_tokens, usage.completion_tokens) for a in found]


def exhausted(account: Account, spent: float) -> TooManyRequests:
    budget = account.budget
    amount = f"{budget.tokens:,} tokens" if budget.measure == "tokens" else f"{budget.cost:g} in cost"
    resets = account.resets.strftime("%Y-%m-%dT%H:%M:%SZ")
    retry_after = max(1, math.ceil((account.resets - datetime.now(UTC)).total_seconds()))
    return TooManyRequests(
        f"The budget of key '{account.key}' for {PERIOD_WORDS[budget.per]} ({amount}) is used up "
        f"({spent:,.6g} spent); it resets at {resets}.",
        code="BudgetExceeded",
        headers={"Retry-After": str(retry_after), "x-budget-reset": resets},
    )
