"""The gateway's live state, built once from Settings (and again at each reload): the router,
the limit store, the metrics, the keys, the dispatcher and the policy pipeline around it
(`gateway/policy/pipeline.py`, which the chat flow calls)."""

from __future__ import annotations

import asyncio
import time

from gateway.config.settings import Settings
from gateway.fleet.dispatch import Dispatcher
from gateway.fleet.router import Router
from gateway.policy.admission import Policy
from gateway.policy.auth import KeyStore
from gateway.policy.limits import Limiter
from gateway.policy.pipeline import Pipeline
from gateway.policy.response_store import MemoryResponses, RedisResponses, create_response_store
from gateway.policy.stores import create_limiter
from gateway.telemetry.metrics import Metrics, metrics_for
from gateway.telemetry.tracing import Tracing, create_tracing


class Runtime:
    """What one Settings built, for the requests begun on it: a reload builds the next and
    retires this one when its requests have ended. It runs nothing itself: the chat flow calls
    its policy pipeline, which hands an admitted request to its dispatcher."""

    def __init__(self, settings: Settings, previous: Runtime | None = None) -> None:
        """`previous`: the runtime a reload replaces; what did not change is taken over from it
        (deployments with their backends and health, the limit store and its counters, the
        metrics), so a reload loses no state."""
        self.settings = settings
        multiprocess = settings.environment.metrics_dir is not None
        self.started: int = previous.started if previous else int(time.time())
        self.router: Router = Router(
            settings.deployments,
            previous.router.deployments if previous else None,
            settings.environment.proxies,
        )
        self.metrics: Metrics = previous.metrics if previous else metrics_for(multiprocess)
        self.keys = KeyStore(settings.keys, settings.keyed)
        same_store = previous is not None and previous.settings.rate_limits == settings.rate_limits
        self.limiter: Limiter = (
            previous.limiter if previous is not None and same_store else create_limiter(settings.rate_limits)
        )
        same_responses = (
            same_store and previous is not None and previous.settings.responses == settings.responses
        )
        self.responses: MemoryResponses | RedisResponses = (
            previous.responses if previous is not None and same_responses else create_response_store(settings)
        )
        same_tracing = previous is not None and previous.settings.tracing == settings.tracing
        self.tracing: Tracing | None = (
            previous.tracing
            if previous is not None and same_tracing
            else create_tracing(settings.tracing, settings.environment)
        )
        self.dispatcher = Dispatcher(self.metrics, self.router.rng, self.tracing)
        self.policy = Policy(settings, self.limiter)
        self.pipeline = Pipeline(self.policy, self.router, self.dispatcher)
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

    async def aclose(self) -> None:
        await self.router.aclose()
        await self.limiter.aclose()
        await self.responses.aclose()
        if self.tracing is not None:
            await self.tracing.aclose()

    async def retire(self, successor: Runtime) -> None:
        """Close what this runtime had and its successor did not take over."""
        kept = set(map(id, successor.router.deployments.values()))
        for deployment in self.router.deployments.values():
            if id(deployment) not in kept:
                await deployment.aclose()
        if self.limiter is not successor.limiter:
            await self.limiter.aclose()
        if self.responses is not successor.responses:
            await self.responses.aclose()
        if self.tracing is not None and self.tracing is not successor.tracing:
            await self.tracing.aclose()
