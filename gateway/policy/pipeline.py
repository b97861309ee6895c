"""The policy, in order: the one place that says which steps a request goes through and when.

Admission (before the backend is asked; each step may refuse the request):
    ROUTE picks the deployment; then ADMISSION, that deployment's steps, in this order.
The answer (as it comes back):
    ANSWER_USAGE — when the usage passes, in this order;
    ANSWER_STREAM — layers stacked on the events, innermost first (for an answer not streamed,
    the same steps see each item on its way to the fold, in the same order).
(The README's "Policy" section lists the same order; tests/unit/test_policy_pipeline.py holds it.)

Each deployment's lists are built once, when the runtime is (at start and at each reload),
with only the steps it has something for; a request then runs its deployment's lists: plain
steps called, an awaitable awaited only when a step returns one (it must wait)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Protocol, TypeVar

from starlette.types import Receive

from gateway.core.canonical import ChatRequest, EventStream, Usage
from gateway.fleet.router import LiveDeployment, Router
from gateway.policy.admission import Admission, Policy
from gateway.policy.admission_steps import (
    Budgets,
    CheckCapabilities,
    CountPrompt,
    DefaultMaxTokens,
    ExtraParameters,
    KeyMayUse,
    MediaScreen,
    PromptFilter,
    RateLimits,
    Route,
)
from gateway.policy.answer_steps import (
    ChargeTokenLimits,
    Cost,
    OutputFilter,
    ReleaseUnsettled,
    SettleBudgets,
    Take,
    release_unsettled,
)
from gateway.policy.auth import Caller
from gateway.telemetry.record import RequestRecord


class AdmissionStep(Protocol):
    def apply(self, admission: Admission) -> Awaitable[None] | None: ...


class UsageStep(Protocol):
    def apply(self, admission: Admission, usage: Usage) -> Awaitable[None] | None: ...


class StreamStep(Protocol):
    def wrap(self, admission: Admission, events: EventStream) -> EventStream: ...

    def taking(self, admission: Admission, take: Take) -> Take: ...


Step = TypeVar("Step", covariant=True)
Built = TypeVar("Built")
OnUsage = Callable[[Usage], Awaitable[None]]


class StepKind(Protocol[Step]):
    """A step's class: whether a deployment needs it, and the step built for it."""

    title: str

    @staticmethod
    def needed(policy: Policy, live: LiveDeployment) -> bool: ...

    def __call__(self, policy: Policy, live: LiveDeployment) -> Step: ...


ROUTE = Route
# after the route, in order; the media screen only for the dialects that screen media
ADMISSION: tuple[StepKind[AdmissionStep], ...] = (
    KeyMayUse,
    ExtraParameters,
    CountPrompt,
    CheckCapabilities,
    DefaultMaxTokens,
    PromptFilter,
    RateLimits,
    Budgets,
    MediaScreen,
)
ANSWER_USAGE: tuple[StepKind[UsageStep], ...] = (Cost, ChargeTokenLimits, SettleBudgets)
ANSWER_STREAM: tuple[StepKind[StreamStep], ...] = (ReleaseUnsettled, OutputFilter)


@dataclass(slots=True)
class DeploymentSteps:
    """One deployment's steps, those it has something for."""

    admission: list[AdmissionStep]  # without the media screen
    screening: list[AdmissionStep]  # with it
    usage: list[UsageStep]
    stream: list[StreamStep]


def built(kinds: tuple[StepKind[Built], ...], policy: Policy, live: LiveDeployment) -> list[Built]:
    return [kind(policy, live) for kind in kinds if kind.needed(policy, live)]


def steps_for(policy: Policy, live: LiveDeployment) -> DeploymentSteps:
    screening = built(ADMISSION, policy, live)
    return DeploymentSteps(
        admission=[step for step in screening if not isinstance(step, MediaScreen)],
        screening=screening,
        usage=built(ANSWER_USAGE, policy, live),
        stream=built(ANSWER_STREAM, policy, live),
    )


class Pipeline:
    """Runs the steps: the route, then the routed deployment's lists."""

    def __init__(self, policy: Policy, router: Router) -> None:
        self.policy = policy
        self.route = ROUTE(router)
        self.steps: Mapping[str, DeploymentSteps] = {
            name: steps_for(policy, live) for name, live in router.deployments.items()
        }

    async def admit(
        self,
        request: ChatRequest,
        headers: Mapping[str, str],
        caller: Caller,
        record: RequestRecord,
        routed_to: str | None = None,
        receive: Receive | None = None,
    ) -> Admission:
        """The admission, or the GatewayError that refuses the request. `receive`: the client's
        channel, given by the dialects that screen media (their steps include the screen)."""
        admission = Admission(request, headers, caller, record, routed_to, receive)
        self.route.apply(admission)
        steps = self.steps[admission.deployment.name]
        try:
            for step in steps.admission if receive is None else steps.screening:
                if (waiting := step.apply(admission)) is not None:
                    await waiting
        except BaseException:
            await self.release(admission)  # refused after its budgets were reserved
            raise
        return admission

    async def release(self, admission: Admission) -> None:
        """Give back a budget reservation no answer will settle (the request was refused or
        ended before its answer began); once settled, nothing."""
        if admission.reservation is not None:
            await release_unsettled(self.policy.limiter, admission.reservation)

    def answer(self, admission: Admission, generate: Callable[[OnUsage | None], EventStream]) -> EventStream:
        """The events `generate` gives, with the answer's steps: the usage steps run when the
        usage passes, the stream steps stacked on the events."""
        steps = self.steps[admission.deployment.name]
        events = generate(usage_handler(steps.usage, admission) if steps.usage else None)
        for step in steps.stream:
            events = step.wrap(admission, events)
        return events

    async def complete(
        self, admission: Admission, complete: Callable[[Take, OnUsage | None], Awaitable[None]], take: Take
    ) -> None:
        """The whole answer `complete` hands over item by item (a request not streamed) to
        `take`, with the answer's steps: the usage steps run when the usage passes, the stream
        steps see each item before `take`; a reservation no usage settled is released however
        it ends."""
        steps = self.steps[admission.deployment.name]
        for step in reversed(steps.stream):
            take = step.taking(admission, take)
        try:
            await complete(take, usage_handler(steps.usage, admission) if steps.usage else None)
        finally:
            if admission.reservation is not None:
                await self.release(admission)


def usage_handler(steps: list[UsageStep], admission: Admission) -> OnUsage:
    async def on_usage(usage: Usage) -> None:
        for step in steps:
            if (waiting := step.apply(admission, usage)) is not None:
                await waiting

    return on_usage
