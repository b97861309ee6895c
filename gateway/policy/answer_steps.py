"""The answer's steps. Two kinds, each a small object with one method: a usage step's `apply`
runs when the answer's usage passes (a plain method, which returns an awaitable only when the
step must wait); a stream step's `wrap`
stacks a layer on the answer's events, and its `taking` does the same for a whole answer's items
on their way to the fold (a request not streamed). Each is built only where a deployment has something for
it to do: every layer costs something on every chunk."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from gateway.core.canonical import EventStream, Item, Usage
from gateway.fleet.router import LiveDeployment
from gateway.policy.admission import Admission, Policy
from gateway.policy.budgets import Reservation, used
from gateway.policy.limits import Limiter

Take = Callable[[Item], None]  # takes a whole answer's items, one by one


class Cost:
    """The answer's cost at the deployment's price, recorded (for the access log and metrics)."""

    title = "cost"

    @staticmethod
    def needed(policy: Policy, live: LiveDeployment) -> bool:
        return live.config.price is not None

    def __init__(self, policy: Policy, live: LiveDeployment) -> None:
        assert live.config.price is not None
        self.price = live.config.price

    def apply(self, admission: Admission, usage: Usage) -> None:
        price = self.price
        spent = usage.prompt_tokens * price.input + usage.completion_tokens * price.output
        admission.record.cost = spent / 1e6


class ChargeTokenLimits:
    """The token limits charged what the answer used beyond the admission's estimate (the
    prompt's true count corrects it, either way)."""

    title = "usage → token limits"

    @staticmethod
    def needed(policy: Policy, live: LiveDeployment) -> bool:
        return policy.key_limited or bool(policy.deployment_limits[live.name])

    def __init__(self, policy: Policy, live: LiveDeployment) -> None:
        self.limiter = policy.limiter

    def apply(self, admission: Admission, usage: Usage) -> Awaitable[None] | None:
        if not admission.buckets:
            return None
        # what admission took was the prompt's estimate; a reported prompt count corrects it
        correction = usage.prompt_tokens - admission.prompt_tokens if usage.prompt_tokens else 0
        return self.limiter.charge(admission.buckets, usage.completion_tokens + correction)


class SettleBudgets:
    """The budgets' reservation settled at what the answer used."""

    title = "budgets settled"

    @staticmethod
    def needed(policy: Policy, live: LiveDeployment) -> bool:
        return policy.budgeted

    def __init__(self, policy: Policy, live: LiveDeployment) -> None:
        self.limiter = policy.limiter
        self.price = live.config.price

    def apply(self, admission: Admission, usage: Usage) -> Awaitable[None] | None:
        held = admission.reservation
        if held is None or held.settled:
            return None
        held.settled = True
        return self.limiter.settle(held, used(held.accounts, usage, self.price))


class ReleaseUnsettled:
    """A reservation no usage settled (the answer failed) released when the answer ends."""

    title = "budgets released when unsettled"

    @staticmethod
    def needed(policy: Policy, live: LiveDeployment) -> bool:
        return policy.budgeted

    def __init__(self, policy: Policy, live: LiveDeployment) -> None:
        self.limiter = policy.limiter

    def wrap(self, admission: Admission, events: EventStream) -> EventStream:
        held = admission.reservation
        return events if held is None else released_when_done(self.limiter, held, events)

    def taking(self, admission: Admission, take: Take) -> Take:
        return take  # a whole answer's reservation is released where it is awaited


async def released_when_done(limiter: Limiter, held: Reservation, events: EventStream) -> EventStream:
    try:
        async for event in events:
            yield event
    finally:
        await events.aclose()
        await release_unsettled(limiter, held)


async def release_unsettled(limiter: Limiter, held: Reservation) -> None:
    """Give back a reservation no answer settled (the request was refused, or its answer ended
    without a usage); once settled, nothing."""
    if not held.settled:
        held.settled = True
        await limiter.settle(held, used(held.accounts, None, None))


class OutputFilter:
    """The content filter's output rules: a choice that trips them ends with finish_reason
    `content_filter`, cut before the match."""

    title = "output filter"

    @staticmethod
    def needed(policy: Policy, live: LiveDeployment) -> bool:
        return policy.content_filter.output is not None

    def __init__(self, policy: Policy, live: LiveDeployment) -> None:
        self.screen = policy.content_filter.screen
        self.screening = policy.content_filter.screening

    def wrap(self, admission: Admission, events: EventStream) -> EventStream:
        return self.screen(events)

    def taking(self, admission: Admission, take: Take) -> Take:
        return self.screening(take)
