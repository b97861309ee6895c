"""The policy, in order: the one place that says which steps a request goes through and when.

Admission (before the backend is asked; each step may refuse the request):
    ROUTE picks the deployment; then ADMISSION, that deployment's steps, in this order.
The answer (as it comes back), streamed or whole alike:
    ANSWER_USAGE — when the usage passes, in this order;
    ANSWER_ITEMS — each item through their screens, in this order (`screen_of`: one call an
    item, made by the dispatcher's one loop, streamed or whole), and their ends when the answer
    has ended.
(docs/configuration/policy.md lists the same order; tests/unit/test_policy_pipeline.py holds it.)

Each deployment's lists are built once, when the runtime is (at start and at each reload),
with only the steps it has something for; a request then runs its deployment's lists: plain
steps called, an awaitable awaited only when a step returns one (it must wait)."""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from typing import Protocol, TypeVar

from starlette.types import Receive

from gateway.core.canonical import ChatRequest, EventStream, Item, Usage
from gateway.fleet.dispatch import OnUsage, QueueWait, Screen, Take
from gateway.fleet.router import RoutedDeployment, Router
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
    ReleaseMedia,
    ReleaseUnsettled,
    SettleBudgets,
)
from gateway.policy.auth import Caller
from gateway.telemetry.record import RequestRecord


class AdmissionStep(Protocol):
    def apply(self, admission: Admission) -> Awaitable[None] | None: ...


class UsageStep(Protocol):
    def apply(self, admission: Admission, usage: Usage) -> Awaitable[None] | None: ...


class ItemStep(Protocol):
    """A step on the answer's items, written once for a streamed and a whole answer."""

    screens: bool  # whether `screen` may give one
    ends: bool  # whether `end` may do something

    def screen(self, admission: Admission) -> Screen | None:
        """What it does to each of this answer's items; None: nothing."""

    def end(self, admission: Admission) -> Awaitable[None] | None:
        """What it does when the answer has ended, however (or never began)."""


class Dispatch(Protocol):
    """Where an admitted request goes for its answer (gateway/fleet/dispatch.py's Dispatcher):
    a stream's items, or a whole answer's handed to `take`."""

    def events(
        self,
        deployment: RoutedDeployment,
        request: ChatRequest,
        record: RequestRecord,
        on_usage: OnUsage | None = None,
        queue: QueueWait | None = None,
        screen: Screen | None = None,
    ) -> EventStream: ...

    def complete(
        self,
        deployment: RoutedDeployment,
        request: ChatRequest,
        record: RequestRecord,
        take: Take,
        on_usage: OnUsage | None = None,
        screen: Screen | None = None,
    ) -> Awaitable[None]: ...


Step = TypeVar("Step", covariant=True)
Built = TypeVar("Built")


class StepKind(Protocol[Step]):
    """A step's class: whether a deployment needs it, and the step built for it."""

    title: str

    @staticmethod
    def needed(policy: Policy, routed: RoutedDeployment) -> bool: ...

    def __call__(self, policy: Policy, routed: RoutedDeployment) -> Step: ...


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
ANSWER_ITEMS: tuple[StepKind[ItemStep], ...] = (ReleaseUnsettled, ReleaseMedia, OutputFilter)


@dataclass(slots=True)
class DeploymentSteps:
    """One deployment's steps, those it has something for."""

    admission: list[AdmissionStep]  # without the media screen
    screening: list[AdmissionStep]  # with it
    usage: list[UsageStep]
    items: list[ItemStep]
    item_screens: list[ItemStep]  # those of the item steps that screen items
    item_ends: list[ItemStep]  # those that end


def steps_built(kinds: tuple[StepKind[Built], ...], policy: Policy, routed: RoutedDeployment) -> list[Built]:
    return [kind(policy, routed) for kind in kinds if kind.needed(policy, routed)]


def steps_for(policy: Policy, routed: RoutedDeployment) -> DeploymentSteps:
    screening = steps_built(ADMISSION, policy, routed)
    items = steps_built(ANSWER_ITEMS, policy, routed)
    return DeploymentSteps(
        admission=[step for step in screening if not isinstance(step, MediaScreen)],
        screening=screening,
        usage=steps_built(ANSWER_USAGE, policy, routed),
        items=items,
        item_screens=[step for step in items if step.screens],
        item_ends=[step for step in items if step.ends],
    )


class Pipeline:
    """Runs the steps: the route, then the routed deployment's lists, around the dispatch."""

    def __init__(self, policy: Policy, router: Router, dispatch: Dispatch) -> None:
        self.policy = policy
        self.route = ROUTE(router)
        self.dispatch = dispatch
        self.steps: Mapping[str, DeploymentSteps] = {
            name: steps_for(policy, routed) for name, routed in router.deployments.items()
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
        """The admission, or the GatewayError that refuses the request. `routed_to`: the
        deployment a dialect's routing header named, if any; `receive`: the client's channel,
        given by the dialects that screen media (their steps include the screen)."""
        admission = Admission(request, headers, caller, record, routed_to, receive)
        self.route.apply(admission)
        steps = self.steps[admission.deployment.name]
        try:
            for step in steps.admission if receive is None else steps.screening:
                if (waiting := step.apply(admission)) is not None:
                    await waiting
        except BaseException:
            await self.end(admission)  # refused after its budgets were reserved
            raise
        return admission

    async def end(self, admission: Admission) -> None:
        """The answer has ended, however, or never began (the request was refused, or ended
        before its answer): the item steps' ends (a budget reservation no usage settled given
        back). A stream's caller calls this when the stream has ended; a whole answer's is
        called by `complete`."""
        for step in self.steps[admission.deployment.name].item_ends:
            if (waiting := step.end(admission)) is not None:
                await waiting

    def answer(self, admission: Admission, queue: QueueWait | None = None) -> EventStream:
        """The answer streamed, with the answer's steps: the usage steps run when the usage
        passes, the item steps' screens on each item. `queue` says while the request waits for
        a replica with room."""
        steps = self.steps[admission.deployment.name]
        on_usage = usage_handler(steps.usage, admission) if steps.usage else None
        screen = screen_of(steps.item_screens, admission) if steps.item_screens else None
        return self.dispatch.events(
            admission.deployment, admission.request, admission.record, on_usage, queue, screen
        )

    async def complete(self, admission: Admission, take: Take) -> None:
        """The whole answer (a request not streamed), handed over item by item to `take`, with
        the same steps as a stream; the item steps' ends run however it ends."""
        steps = self.steps[admission.deployment.name]
        on_usage = usage_handler(steps.usage, admission) if steps.usage else None
        screen = screen_of(steps.item_screens, admission) if steps.item_screens else None
        try:
            await self.dispatch.complete(
                admission.deployment, admission.request, admission.record, take, on_usage, screen
            )
        finally:
            if steps.item_ends:
                await self.end(admission)


def usage_handler(steps: list[UsageStep], admission: Admission) -> OnUsage:
    async def on_usage(usage: Usage) -> None:
        for step in steps:
            if (waiting := step.apply(admission, usage)) is not None:
                await waiting

    return on_usage


def screen_of(steps: list[ItemStep], admission: Admission) -> Screen | None:
    """One answer's screens as one: the item steps' screens, in order."""
    if len(steps) == 1:
        return steps[0].screen(admission)
    screens = [screen for step in steps if (screen := step.screen(admission)) is not None]
    if len(screens) <= 1:
        return screens[0] if screens else None

    def chained(item: Item) -> Item | None:
        for screen in screens:
            if (passed := screen(item)) is None:
                return None
            item = passed
        return item

    return chained
