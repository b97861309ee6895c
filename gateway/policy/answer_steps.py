"""The answer's steps. Two kinds, each a small object: a usage step's `apply` runs when the
answer's usage passes (a plain method, which returns an awaitable only when the step must wait);
an item step is written once for a streamed and a whole answer alike: its `screen` gives what it
does to each of one answer's items (or None: nothing), its `end` what it does when the answer has
ended, however (or never began). Each is built only where a deployment has something for it to
do: a screen costs something on every chunk."""

from __future__ import annotations

from collections.abc import Awaitable

from gateway.core.canonical import Usage
from gateway.fleet.dispatch import Screen
from gateway.fleet.router import RoutedDeployment
from gateway.policy.admission import Admission, Policy
from gateway.policy.budgets import Reservation, used
from gateway.policy.limits import Limiter


class Cost:
    """The answer's cost at the deployment's price, recorded (for the access log and metrics)."""

    title = "cost"

    @staticmethod
    def needed(policy: Policy, routed: RoutedDeployment) -> bool:
        return routed.config.price is not None

    def __init__(self, policy: Policy, routed: RoutedDeployment) -> None:
        assert routed.config.price is not None
        self.price = routed.config.price

    def apply(self, admission: Admission, usage: Usage) -> None:
        price = self.price
        spent = usage.prompt_tokens * price.input + usage.completion_tokens * price.output
        admission.record.cost = spent / 1e6


class ChargeTokenLimits:
    """The token limits charged what the answer used beyond the admission's estimate (the
    prompt's true count corrects it, either way)."""

    title = "usage → token limits"

    @staticmethod
    def needed(policy: Policy, routed: RoutedDeployment) -> bool:
        return policy.key_limited or bool(policy.deployment_limits[routed.name])

    def __init__(self, policy: Policy, routed: RoutedDeployment) -> None:
        self.limiter = policy.limiter

    def apply(self, admission: Admission, usage: Usage) -> Awaitable[None] | None:
        if not admission.buckets:
            return None
        # what admission took was the prompt's estimate; a reported prompt count corrects it
        correction = usage.prompt_tokens - admission.charged_prompt_tokens if usage.prompt_tokens else 0
        return self.limiter.charge(admission.buckets, usage.completion_tokens + correction)


class SettleBudgets:
    """The budgets' reservation settled at what the answer used."""

    title = "budgets settled"

    @staticmethod
    def needed(policy: Policy, routed: RoutedDeployment) -> bool:
        return policy.budgeted

    def __init__(self, policy: Policy, routed: RoutedDeployment) -> None:
        self.limiter = policy.limiter
        self.price = routed.config.price

    def apply(self, admission: Admission, usage: Usage) -> Awaitable[None] | None:
        held = admission.reservation
        if held is None or held.settled:
            return None
        held.settled = True
        return self.limiter.settle(held, used(held.accounts, usage, self.price))


class ReleaseUnsettled:
    """A reservation no usage settled (the answer failed) released when the answer ends."""

    title = "budgets released when unsettled"
    screens, ends = False, True

    @staticmethod
    def needed(policy: Policy, routed: RoutedDeployment) -> bool:
        return policy.budgeted

    def __init__(self, policy: Policy, routed: RoutedDeployment) -> None:
        self.limiter = policy.limiter

    def screen(self, admission: Admission) -> Screen | None:
        return None

    def end(self, admission: Admission) -> Awaitable[None] | None:
        held = admission.reservation
        return None if held is None or held.settled else release_unsettled(self.limiter, held)


class ReleaseMedia:
    """The worker's memory that a request's images held, given back when its answer ends."""

    title = "images' memory given back"
    screens, ends = False, True

    @staticmethod
    def needed(policy: Policy, routed: RoutedDeployment) -> bool:
        return policy.media.holds_images

    def __init__(self, policy: Policy, routed: RoutedDeployment) -> None:
        pass

    def screen(self, admission: Admission) -> Screen | None:
        return None

    def end(self, admission: Admission) -> Awaitable[None] | None:
        if admission.media is not None:
            admission.media.release()
        return None


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
    screens, ends = True, False

    @staticmethod
    def needed(policy: Policy, routed: RoutedDeployment) -> bool:
        return policy.content_filter.output is not None

    def __init__(self, policy: Policy, routed: RoutedDeployment) -> None:
        self.content_filter = policy.content_filter

    def screen(self, admission: Admission) -> Screen | None:
        return self.content_filter.answer_screen()

    def end(self, admission: Admission) -> Awaitable[None] | None:
        return None
