"""Budgets: how much a key may use per calendar day, week or month (UTC), in tokens or in cost.

At admission each budget of the key gets a reservation in the rate-limit store, atomically (the
store refuses when a budget would go past its amount): the estimated prompt for a soft budget,
the prompt and the most the answer may generate (`max_tokens`, n times) for a `hard` one. The
reservation is held apart from what was spent: settling it releases it and adds what the answer
used (what was relayed, for one that ended early), so an account never goes below zero, even
when the store lost the reservation meanwhile. In Redis a reservation is a lease its gateway
renews while the request runs: one whose gateway died stops counting when the lease runs out.
Periods are read on the store's clock (Redis's TIME; this host's for the memory store), so every
gateway starts a new day when the store does. A refused request gets 429 saying which budget and
when it resets.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from backends.base import Capabilities
from gateway.config.settings import Budget, Price
from gateway.core.canonical import ChatRequest, Usage
from gateway.core.errors import BadRequest, TooManyRequests

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
    def forgotten_at(self) -> float:
        """When the store may forget the account (epoch seconds, its clock): past the period,
        a little (an answer still running at the reset settles into it)."""
        return self.resets.timestamp() + 3600

    def spend(
        self, tokens: float, price: Price | None, prompt: float = 0.0, completion: float = 0.0
    ) -> float:
        """What `tokens` (or a prompt/completion split) cost against this budget."""
        if self.budget.measure == "tokens":
            return tokens
        if price is None:
            return 0.0
        return (prompt * price.input + completion * price.output) / 1_000_000

    def in_period(self, now: float) -> bool:
        return self.starts.timestamp() <= now < self.resets.timestamp()

    def moved_to(self, now: float) -> Account:
        """The same budget's account in the period holding `now` (epoch seconds)."""
        return Account(self.key, self.budget, *period_bounds(self.budget.per, at(now)))


def at(now: float) -> datetime:
    return datetime.fromtimestamp(now, UTC)


def accounts(key: str, budgets: list[Budget], now: float) -> list[Account]:
    """The key's accounts in the periods holding `now` (epoch seconds, on the store's clock)."""
    moment = at(now)
    return [Account(key, b, *period_bounds(b.per, moment)) for b in budgets]


@dataclass(slots=True, weakref_slot=True)
class Reservation:
    """What admission holds against a key's accounts until the answer settles it, once, to what it
    used. `id` names it in the store; `amounts` are what it holds of each account (the store may
    move `accounts` to the period its clock is in)."""

    accounts: list[Account]
    amounts: list[float]
    id: str = field(default_factory=lambda: secrets.token_hex(8))
    settled: bool = False


def most_generated(request: ChatRequest, capabilities: Capabilities) -> int:
    """The most completion tokens a request may be answered with: n times its `max_tokens` (the
    deployment's default when it named none), else what the model's context leaves. A request
    with no bound at all cannot be held against a hard budget: it is refused, naming the fix."""
    if request.max_tokens is not None:
        return request.n * request.max_tokens
    if capabilities.context_length is not None:
        return request.n * max(0, capabilities.context_length - request.prompt_tokens)
    raise BadRequest(
        "This key has a hard budget and the deployment sets no default maximum: the request must "
        "say how many tokens it may generate (max_tokens or max_completion_tokens).",
        param="max_tokens",
        loc=["body", "max_tokens"],
        code="MaxTokensRequired",
    )


def reservation(
    found: list[Account], prompt_tokens: int, price: Price | None, completion: int = 0
) -> Reservation:
    """What admission reserves against each account: the estimated prompt, and for a hard budget
    the `completion` tokens the answer may add."""
    amounts = [
        a.spend(prompt_tokens + completion, price, prompt_tokens, completion)
        if a.budget.hard
        else a.spend(prompt_tokens, price, prompt=prompt_tokens)
        for a in found
    ]
    return Reservation(found, amounts)


def used(found: list[Account], usage: Usage | None, price: Price | None) -> list[float]:
    """What an answer used of each account: nothing when it ended without a usage (it failed)."""
    if usage is None:
        return [0.0] * len(found)
    return [a.spend(usage.total_tokens, price, usage.prompt_tokens, usage.completion_tokens) for a in found]


def number(value: float, measure: str) -> str:
    return f"{value:,.0f} tokens" if measure == "tokens" else f"{value:,.6g} in cost"


def exhausted(account: Account, spent: float, asked: float, now: float) -> TooManyRequests:
    """The 429 of a budget that cannot hold what the request reserves (`asked`): `spent` is what
    the account has spent and holds, `now` the store's time."""
    budget = account.budget
    amount = number(budget.amount, budget.measure)
    resets = account.resets.strftime("%Y-%m-%dT%H:%M:%SZ")
    retry_after = max(1, math.ceil(account.resets.timestamp() - now))
    if budget.hard:
        left = max(0.0, budget.amount - spent)
        message = (
            f"The hard budget of key '{account.key}' for {PERIOD_WORDS[budget.per]} ({amount}) has "
            f"{number(left, budget.measure)} left ({spent:,.6g} spent or held); this request may "
            f"use up to {number(asked, budget.measure)} (its prompt and max_tokens); it resets at {resets}."
        )
    else:
        message = (
            f"The budget of key '{account.key}' for {PERIOD_WORDS[budget.per]} ({amount}) is used up "
            f"({spent:,.6g} spent); it resets at {resets}."
        )
    return TooManyRequests(
        message, code="BudgetExceeded", headers={"Retry-After": str(retry_after), "x-budget-reset": resets}
    )
