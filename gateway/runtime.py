"""The gateway's live state, built once from Settings, and the policy applied to each request:
route → who may use what → extra parameters → capabilities → content filter → rate limits."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from gateway.config import Settings
from gateway.core.canonical import ChatRequest, EventStream, Usage
from gateway.core.errors import DeploymentForbidden
from gateway.dispatch import Dispatcher
from gateway.metrics import Metrics
from gateway.policy import capabilities
from gateway.policy.auth import Caller, KeyStore
from gateway.policy.budgets import Reservation, accounts, exhausted, most_generated, reservation, used
from gateway.policy.content_filter import Filter
from gateway.policy.extra_params import DROPPED_HEADER, apply_extra_params, dropped_header, resolve_policy
from gateway.policy.extra_params import HEADER as EXTRA_PARAMS_HEADER
from gateway.policy.limits import (
    Bucket,
    Limiter,
    RawHeaders,
    buckets_for,
    limited_kinds,
    rate_headers,
    refused,
    too_large,
)
from gateway.policy.media import MediaPolicy
from gateway.policy.stores import create_limiter
from gateway.policy.token_count import PromptCounter
from gateway.record import RequestRecord
from gateway.router import LiveDeployment, Router
from gateway.tracing import Tracing, create_tracing


@dataclass(slots=True)
class Admission:
    """A request the policy let through: where it goes and what it is charged to."""

    deployment: LiveDeployment
    caller: Caller
    prompt_tokens: int = 0  # as estimated (or counted) at admission
    buckets: list[Bucket] = field(default_factory=list)
    headers: RawHeaders = field(default_factory=list)  # sent with the answer: x-ratelimit-*
    reservation: Reservation | None = None  # what admission holds against the key's budgets


class Runtime:
    def __init__(self, settings: Settings, previous: Runtime | None = None) -> None:
        """`previous`: the runtime a reload replaces; what did not change is taken over from it
        (deployments with their backends and health, the limit store and its counters, the
        metrics), so a reload loses no state."""
        self.settings = settings
        self.started: int = previous.started if previous else int(time.time())
        self.router: Router = Router(settings.deployments, previous.router.deployments if previous else None)
        self.metrics: Metrics = previous.metrics if previous else Metrics()
        self.keys = KeyStore(settings.keys, settings.keyed)
        same_store = previous is not None and previous.settings.rate_limits == settings.rate_limits
        self.limiter: Limiter = (
            previous.limiter if previous is not None and same_store else create_limiter(settings.rate_limits)
        )
        self.content_filter = Filter(settings.content_filter)
        same_tracing = previous is not None and previous.settings.tracing == settings.tracing
        self.tracing: Tracing | None = (
            previous.tracing if previous is not None and same_tracing else create_tracing(settings.tracing)
        )
        self.dispatcher = Dispatcher(self.metrics, self.router.rng, self.tracing)
        self.counters = {d.name: PromptCounter(d.tokenizer) for d in settings.deployments}
        self.media = MediaPolicy(settings.media)
        self.key_limits = {k.name: buckets_for(f"key:{k.name}", k.limits) for k in settings.keys}
        self.in_flight = 0  # chat requests begun on this runtime and not yet ended
        self.drained: asyncio.Event | None = None  # set when in_flight reaches 0, once asked for

    def began(self) -> None:
        self.in_flight += 1

    def ended(self) -> None:
        self.in_flight -= 1
        if not self.in_flight and self.drained is not None:
            self.drained.set()

    async def finished(self, timeout: float) -> bool:
        """Wait until every request begun on this runtime has ended (True), at most `timeout`."""
        if not self.in_flight:
            return True
        self.drained = self.drained or asyncio.Event()
        try:
            await asyncio.wait_for(self.drained.wait(), timeout)
        except TimeoutError:
            return False
        return True

    @property
    def longest_request(self) -> float:
        """The most seconds a request may take here (its deployment's total timeout)."""
        return max(d.timeouts.total for d in self.settings.deployments)

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
            raise DeploymentForbidden(deployment.name, asked=deployment_name or request.model)
        policy = resolve_policy(headers.get(EXTRA_PARAMS_HEADER), deployment.config.extra_parameters)
        dropped = apply_extra_params(request, policy)
        request.deployment = deployment.name
        prompt_tokens = request.prompt_tokens = await self.counters[deployment.name].count(request.messages)
        capabilities.check(request, deployment.capabilities, prompt_tokens)
        if request.max_tokens is None:  # bounded like a model's answer, where the deployment says
            request.max_tokens = deployment.capabilities.default_max_tokens
        self.content_filter.check_prompt(request.messages)
        admission = Admission(deployment, caller, prompt_tokens)
        admission.buckets = [*self.key_limits.get(caller.name, []), *deployment.buckets]
        if admission.buckets:
            verdict = await self.limiter.take(admission.buckets, prompt_tokens)
            if not verdict.allowed:
                oversized = too_large(verdict)  # looked for only once refused: no cost when admitted
                record.rate_limited = "tokens" if oversized else limited_kinds(verdict)
                raise oversized or refused(verdict)
            admission.headers = rate_headers(verdict)
        if dropped:
            admission.headers.append((DROPPED_HEADER.encode(), dropped_header(dropped)))
        if caller.key is not None and caller.key.budgets:
            budgets = caller.key.budgets
            found = accounts(caller.name, budgets, self.limiter.now())
            # a hard budget holds the most the answer may generate, too
            hard = any(b.hard for b in budgets)
            completion = most_generated(request, deployment.capabilities) if hard else 0
            held = reservation(found, prompt_tokens, deployment.config.price, completion)
            used_up = await self.limiter.reserve(held)
            if used_up is not None:
                record.rate_limited = "budget"
                account, spent = used_up
                asked = held.amounts[held.accounts.index(account)]
                raise exhausted(account, spent, asked, self.limiter.now())
            admission.reservation = held
        return admission

    def generate(self, admission: Admission, request: ChatRequest, record: RequestRecord) -> EventStream:
        """The backend's events (through retries, fallback and timeouts), screened by the output
        filter. When the usage passes, the token limits are charged what the answer used beyond
        the admission's estimate (the prompt's true count corrects it, either way), the budgets
        are settled, and the cost is recorded. Each layer is stacked only when configured: every
        layer costs something on every chunk."""
        price = admission.deployment.config.price
        on_usage = None
        if admission.buckets or admission.reservation or price is not None:
            on_usage = self.usage_handler(admission, record)
        events = self.dispatcher.events(admission.deployment, request, record, on_usage)
        if admission.reservation is not None:
            events = self.settle_when_done(admission.reservation, events)
        if self.content_filter.output is not None:
            events = self.content_filter.screen(events)
        return events

    def usage_handler(
        self, admission: Admission, record: RequestRecord
    ) -> Callable[[Usage], Awaitable[None]]:
        limiter, price = self.limiter, admission.deployment.config.price

        async def on_usage(usage: Usage) -> None:
            if price is not None:
                record.cost = (
                    usage.prompt_tokens * price.input + usage.completion_tokens * price.output
                ) / 1e6
            if admission.buckets:
                # what admission took was the prompt's estimate; a reported prompt count corrects it
                correction = usage.prompt_tokens - admission.prompt_tokens if usage.prompt_tokens else 0
                await limiter.charge(admission.buckets, usage.completion_tokens + correction)
            held = admission.reservation
            if held is not None and not held.settled:
                held.settled = True
                await limiter.settle(held, used(held.accounts, usage, price))

        return on_usage

    async def release(self, admission: Admission) -> None:
        """Give back a budget reservation no answer will settle (the request was refused or
        ended before its answer began); once settled, nothing."""
        held = admission.reservation
        if held is not None and not held.settled:
            held.settled = True
            await self.limiter.settle(held, used(held.accounts, None, None))

    async def settle_when_done(self, held: Reservation, events: EventStream) -> EventStream:
        """Release a budget reservation that no usage settled when the answer ends (it failed)."""
        try:
            async for event in events:
                yield event
        finally:
            await events.aclose()
            if not held.settled:
                held.settled = True
                await self.limiter.settle(held, used(held.accounts, None, None))

    async def aclose(self) -> None:
        await self.router.aclose()
        await self.limiter.aclose()
        if self.tracing is not None:
            await self.tracing.aclose()

    async def retire(self, successor: Runtime) -> None:
        """Close what this runtime had and its successor did not take over."""
        taken = set(map(id, successor.router.deployments.values()))
        for live in self.router.deployments.values():
            if id(live) not in taken:
                for replica in live.replicas:
                    await replica.backend.aclose()
        if self.limiter is not successor.limiter:
            await self.limiter.aclose()
        if self.tracing is not None and self.tracing is not successor.tracing:
            await self.tracing.aclose()
