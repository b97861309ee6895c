"""The gateway's live state, built once from Settings, and the policy applied to each request:
route → who may use what → extra parameters → capabilities → content filter → rate limits."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from gateway.config import Settings
from gateway.core.canonical import ChatRequest, EventStream, Usage
from gateway.core.errors import DeploymentForbidden
from gateway.dispatch import Dispatcher
from gateway.metrics import Metrics
from gateway.policy import capabilities
from gateway.policy.auth import Caller, KeyStore
from gateway.policy.content_filter import Filter, prompt_text
from gateway.policy.extra_params import HEADER as EXTRA_PARAMS_HEADER
from gateway.policy.extra_params import apply_extra_params, resolve_policy
from gateway.policy.limits import (
    Bucket,
    RawHeaders,
    buckets_for,
    create_limiter,
    limited_kinds,
    rate_headers,
    refused,
)
from gateway.policy.media import MediaPolicy
from gateway.record import RequestRecord
from gateway.router import LiveDeployment, Router

MESSAGE_OVERHEAD_TOKENS = 3


def estimate_prompt_tokens(messages: list[dict]) -> int:
    """About four characters a token, plus a few per message: cheap, and never zero."""
    return math.ceil(len(prompt_text(messages)) / 4) + MESSAGE_OVERHEAD_TOKENS * len(messages)


@dataclass(slots=True)
class Admission:
    """A request the policy let through: where it goes and what it is charged to."""

    deployment: LiveDeployment
    caller: Caller
    buckets: list[Bucket] = field(default_factory=list)
    headers: RawHeaders = field(default_factory=list)  # sent with the answer: x-ratelimit-*


class Runtime:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.started = int(time.time())
        self.router = Router(settings.deployments)
        self.metrics = Metrics()
        self.dispatcher = Dispatcher(self.metrics, self.router.rng)
        self.keys = KeyStore(settings.keys)
        self.limiter = create_limiter(settings.rate_limits)
        self.content_filter = Filter(settings.content_filter)
        self.media = MediaPolicy(settings.media)
        self.key_limits = {k.name: buckets_for(f"key:{k.name}", k.limits) for k in settings.keys}

    async def admit(
        self,
        request: ChatRequest,
        headers: Mapping[str, str],
        caller: Caller,
        record: RequestRecord,
        deployment_name: str | None = None,
    ) -> Admission:
        """Apply policy; raise the GatewayError that refuses the request. `deployment_name` is
        what a dialect's routing header named, if it has one."""
        record.key = caller.name
        deployment = self.router.route(request.model, deployment_name)
        record.deployment = deployment.name
        if not caller.may_use(deployment.name):
            raise DeploymentForbidden(deployment.name)
        policy = resolve_policy(headers.get(EXTRA_PARAMS_HEADER), deployment.config.extra_parameters)
        apply_extra_params(request, policy)
        request.deployment = deployment.name
        prompt_tokens = estimate_prompt_tokens(request.messages)
        capabilities.check(request, deployment.capabilities, prompt_tokens)
        if request.max_tokens is None:  # bounded like a model's answer, where the deployment says
            request.max_tokens = deployment.capabilities.default_max_tokens
        self.content_filter.check_prompt(request.messages)
        admission = Admission(deployment, caller)
        admission.buckets = [*self.key_limits.get(caller.name, []), *deployment.buckets]
        if admission.buckets:
            verdict = await self.limiter.take(admission.buckets, prompt_tokens)
            if not verdict.allowed:
                record.rate_limited = limited_kinds(verdict)
                raise refused(verdict)
            admission.headers = rate_headers(verdict)
        return admission

    def generate(self, admission: Admission, request: ChatRequest, record: RequestRecord) -> EventStream:
        """The backend's events (through retries, fallback and timeouts), screened by the output
        filter; completion tokens are charged to the rate limits when the usage passes. The
        filter is stacked only when configured: every layer costs something on every chunk."""
        charge = None
        if admission.buckets:
            buckets, limiter = admission.buckets, self.limiter

            async def charge(usage: Usage) -> None:
                await limiter.charge(buckets, usage.completion_tokens)

        events = self.dispatcher.events(admission.deployment, request, record, charge)
        if self.content_filter.output is not None:
            events = self.content_filter.screen(events)
        return events

    async def aclose(self) -> None:
        await self.router.aclose()
        await self.limiter.aclose()
