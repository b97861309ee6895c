"""What the policy steps share: the request on its way through them (`Admission`), and the parts
built once per runtime that they read (`Policy`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from starlette.types import Receive

from gateway.config.settings import Settings
from gateway.core.canonical import ChatRequest
from gateway.core.token_count import PromptCounter
from gateway.fleet.router import RoutedDeployment
from gateway.policy.auth import Caller
from gateway.policy.budgets import Reservation
from gateway.policy.content_filter import Filter
from gateway.policy.limits import Bucket, Limiter, RawHeaders, buckets_for
from gateway.policy.media import HeldMedia, MediaPolicy
from gateway.telemetry.record import RequestRecord


@dataclass(slots=True)
class Admission:
    """A request on its way through the admission steps; once through, what the policy let
    through: where it goes and what it is charged to. The answer's steps read it too."""

    request: ChatRequest
    asked: Mapping[str, str]  # the request's headers (lower-case names)
    caller: Caller
    record: RequestRecord
    routed_to: str | None = None  # the deployment a dialect's routing header named, if any
    receive: Receive | None = None  # to hear the client go away (while images are fetched)
    deployment: RoutedDeployment = field(init=False)  # set by the first step, the route
    prompt_tokens: int = 0  # as estimated (or counted) at admission
    buckets: list[Bucket] = field(default_factory=list)
    headers: RawHeaders = field(default_factory=list)  # sent with the answer: x-ratelimit-*
    reservation: Reservation | None = None  # what admission holds against the key's budgets
    media: HeldMedia | None = None  # what its images hold of the worker's memory for them

    @property
    def charged_prompt_tokens(self) -> int:
        """The prompt as the answer's usage will charge it: once, or once a choice where each
        choice is an upstream request of its own that reads it (a fan-out)."""
        if self.deployment.capabilities.prompt_per_choice:
            return self.prompt_tokens * self.request.n
        return self.prompt_tokens


class Policy:
    """The parts the steps use, built once per runtime from the settings."""

    def __init__(self, settings: Settings, limiter: Limiter) -> None:
        self.limiter = limiter
        self.keyed = bool(settings.keys)  # without keys every caller is anonymous: may use all
        self.content_filter = Filter(settings.content_filter)
        self.counters = {d.name: PromptCounter(d.tokenizer) for d in settings.deployments}
        self.media = MediaPolicy(settings.media)
        self.key_limits = {k.name: buckets_for(f"key:{k.name}", k.limits) for k in settings.keys}
        self.key_limited = any(self.key_limits.values())
        self.budgeted = any(k.budgets for k in settings.keys)
        self.deployment_limits = {
            d.name: buckets_for(f"deployment:{d.name}", d.limits) for d in settings.deployments
        }
