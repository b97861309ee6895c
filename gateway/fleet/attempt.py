"""One try of a request on one replica: its span, the timer on the upstream's waits, the relay
of its events, the replica's health verdict, and the upstream's stream closed however it ends."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Literal

from gateway.core.canonical import (
    ChatRequest,
    EventStream,
    Item,
    RefusalDelta,
    TextDelta,
    ToolCallDelta,
    Usage,
)
from gateway.core.deadline import Deadline, DeadlinePassed
from gateway.core.errors import (
    BadGateway,
    GatewayError,
    GatewayTimeout,
    ServiceUnavailable,
    TooManyRequests,
    UpstreamAnswerTooLarge,
    UpstreamBusy,
    UpstreamRefused,
    UpstreamUnreachable,
)
from gateway.fleet.router import Replica, RoutedDeployment
from gateway.telemetry.metrics import Metrics
from gateway.telemetry.record import RequestRecord
from gateway.telemetry.tracing import Tracing

if TYPE_CHECKING:
    from opentelemetry.trace import Span

# Upstream failures worth another replica: it is down, broken, or busy (connection errors, 5xx,
# 429, timeouts). An upstream's 4xx is the request's own fault: never retried, no health mark.
RETRYABLE = (BadGateway, ServiceUnavailable, TooManyRequests, GatewayTimeout)
# ... except these, which another try gets again: the gateway's credentials refused (401/403),
# an answer too large to relay. No health mark either.
NOT_RETRIED = (UpstreamRefused, UpstreamAnswerTooLarge)


Verdict = Literal["busy", "down", "failed", "failed-now", "none"]


def verdict_of(error: GatewayError) -> Verdict:
    """What an upstream failure says of the replica that gave it."""
    if isinstance(error, TooManyRequests | UpstreamBusy):
        return "busy"  # it said so (429), or its connections are all taken: not broken
    if isinstance(error, UpstreamUnreachable | GatewayTimeout):
        return "down"
    return "failed"


def delivered_tokens(event: TextDelta | RefusalDelta | ToolCallDelta) -> int:
    """The completion tokens one relayed event holds, for an answer that ends without its usage:
    its logprob entries, else its words (at least one for any text: a streamed fragment is a
    token or more), as the openai-compatible backend estimates an upstream's missing usage."""
    if isinstance(event, ToolCallDelta):
        text = event.arguments
    elif event.logprobs:
        return len(event.logprobs)
    else:
        text = event.text
    return len(text.split()) or (1 if text else 0)


class Watchdog:
    """Times the waits for an upstream's next event with one timer per stream, not one per event
    (gateway/core/deadline.py).

    Only the wait for the upstream is timed (a slow client must not look like a slow model).
    """

    def __init__(self) -> None:
        self.deadline = Deadline(0.0)
        self.loop = self.deadline.loop
        self.timeout, self.what = 0.0, ""  # the armed wait's (Attempt.arm sets them), for its error

    async def next(self, events: EventStream, timeout: float, what: str) -> Item | None:
        self.deadline.when = self.loop.time() + timeout
        try:
            return await self.deadline.wait(anext(events, None))
        except DeadlinePassed:
            raise timed_out(timeout, what) from None

    def timed_out(self) -> GatewayTimeout:
        return timed_out(self.timeout, self.what)

    def stop(self) -> None:
        self.deadline.close()


def timed_out(timeout: float, what: str) -> GatewayTimeout:
    return GatewayTimeout(f"The model did not answer in time ({what}: {timeout:g}s).", code="UpstreamTimeout")


class Attempt:
    """A request on one replica, from its start to its verdict.

    `first_item()` waits for the first event (the time to first token); before it, a failure may be
    tried elsewhere (`failed`, `abandon`); after it, the dispatcher passes each item on inside
    `async with attempt` (`noted`, then `next_item`), which settles how it ended."""

    def __init__(
        self,
        routed: RoutedDeployment,
        replica: Replica,
        request: ChatRequest,
        record: RequestRecord,
        deadline: float,
        metrics: Metrics,
        tracing: Tracing | None,
        on_usage: Callable[[Usage], Awaitable[None]] | None,
    ) -> None:
        self.deployment, self.replica = routed, replica
        self.request, self.record = request, record
        self.deadline = deadline
        self.metrics = metrics
        self.on_usage = on_usage
        record.deployment, record.replica = routed.name, replica.name
        self.slots = routed.slots_for(request)
        replica.started(self.slots, record.key)
        self.begun = time.monotonic()
        metrics.replica_health(routed.name, replica)
        self.span = self.start_span(tracing)
        self.events = replica.backend.generate(request)
        self.watchdog = Watchdog()
        self.idle = routed.config.timeouts.idle
        self.relayed = 0  # completion tokens passed on, while no usage has come
        self.usage_seen = False

    def start_span(self, tracing: Tracing | None) -> Span | None:
        """A client span for this attempt, under the request's server span; the upstream gets its
        traceparent (with tracing off, the client's own goes on as it came)."""
        if tracing is None or self.record.span is None:
            return None
        routed, request = self.deployment, self.request
        model = request.model or routed.model
        span = tracing.client_span(
            self.record.span, routed.name, self.replica.name, routed.config.backend, model
        )
        carried = tracing.traceparent(span)
        request.trace.traceparent = carried.get("traceparent", request.trace.traceparent)
        return span

    def end_span(self) -> None:
        if self.span is not None:
            self.span.end()

    async def first_item(self) -> Item | None:
        timeout = min(self.deployment.config.timeouts.first_token, self.deadline - time.monotonic())
        return await self.watchdog.next(self.events, timeout, "time to first token")

    async def __aenter__(self) -> Attempt:
        return self

    async def __aexit__(self, kind: object, error: BaseException | None, traceback: object) -> None:
        """However the answer that began ended (streamed or whole): the verdict and the upstream
        closed on an error; an answer that ended without its usage (the client gone, the upstream
        cut or timed out) charged what was relayed (`charge_unseen`); the span ended."""
        try:
            try:
                if error is not None:
                    await self.ended_by(error)
            finally:
                await self.charge_unseen()
            if error is None:
                self.succeeded()
        finally:
            self.end_span()

    def noted(self, item: Item) -> Awaitable[None] | None:
        """What an item passing on tells the record and the bill: the first token, the tokens
        relayed, the usage (the charge for it, to await)."""
        charging = None
        for event in item if isinstance(item, list) else (item,):
            if isinstance(event, TextDelta | RefusalDelta | ToolCallDelta):
                if self.record.first_token_at is None:
                    self.record.first_token()
                self.relayed += delivered_tokens(event)
            elif isinstance(event, Usage):
                self.usage_seen = True
                self.record.prompt_tokens = event.prompt_tokens
                self.record.completion_tokens = event.completion_tokens
                if self.span is not None:
                    self.span.set_attributes(
                        {
                            "gen_ai.usage.input_tokens": event.prompt_tokens,
                            "gen_ai.usage.output_tokens": event.completion_tokens,
                        }
                    )
                if self.on_usage is not None:
                    charging = self.on_usage(event)
        return charging

    def next_item(self) -> Awaitable[Item | None]:
        """The upstream's next item, within the idle timeout and what is left of the total."""
        return self.watchdog.next(self.events, *self.next_limit())

    def arm(self, task: asyncio.Task) -> None:
        """`task`'s next wait for the upstream's item timed as `next_item` times it, by a loop
        that waits itself (gateway/fleet/dispatch.py's relay, once a relayed item)."""
        watchdog = self.watchdog
        watchdog.timeout, watchdog.what = self.next_limit()
        watchdog.deadline.arm(task, watchdog.loop.time() + watchdog.timeout)

    def next_limit(self) -> tuple[float, str]:
        """How long the wait for the next item may take: the idle timeout, or what is left of
        the total (none left: TotalTimeout)."""
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise GatewayTimeout("The request took longer than its total time.", code="TotalTimeout")
        idle = self.idle
        return (idle, "idle between chunks") if idle <= remaining else (remaining, "total time")

    async def ended_by(self, error: BaseException) -> None:
        """The answer, begun, ended in `error`: the replica's verdict and the upstream closed."""
        if isinstance(error, NOT_RETRIED):
            await self.failed(error, verdict="none")
        elif isinstance(error, RETRYABLE):
            # the answer had begun: a replica that breaks off (or goes quiet) is to blame
            verdict = verdict_of(error)
            await self.failed(error, "failed-now" if verdict == "failed" else verdict)
        elif isinstance(error, GatewayError):
            self.span_failed(error)
            await self.abandon()
        else:  # the client went away (GeneratorExit, cancellation)
            await self.abandon()

    async def charge_unseen(self) -> None:
        """Closing just before the usage must not make the answer free: an answer that ended
        without its usage is charged the prompt as admission counted it (once a choice where
        each choice was an upstream request of its own), and what was relayed."""
        if not self.usage_seen:
            prompt_tokens = self.request.prompt_tokens
            if self.deployment.capabilities.prompt_per_choice:
                prompt_tokens *= self.request.n
            self.record.prompt_tokens, self.record.completion_tokens = prompt_tokens, self.relayed
            if self.on_usage is not None:
                await self.on_usage(Usage(prompt_tokens, self.relayed))

    def succeeded(self) -> None:
        self.watchdog.stop()
        self.replica.succeeded(time.monotonic() - self.begun, self.slots, self.record.key)
        self.metrics.replica_health(self.deployment.name, self.replica)

    def span_failed(self, error: GatewayError) -> None:
        if self.span is not None:
            from opentelemetry.trace import Status, StatusCode

            self.span.set_attributes({"error.type": error.code, "http.response.status_code": error.status})
            self.span.set_status(Status(StatusCode.ERROR, error.code))

    async def failed(self, error: GatewayError, verdict: Verdict = "failed-now") -> None:
        """Ended in an upstream error: its span, its timer, the replica's health (by the verdict:
        "down" ejects it, "failed-now" marks it, "failed" leaves the mark to the request's later
        attempts, "busy" and "none" mark nothing), the error counted, the upstream's stream
        closed."""
        self.span_failed(error)
        self.watchdog.stop()
        replica = self.replica
        if verdict == "down":
            replica.eject(self.slots, self.record.key)
        elif verdict == "failed-now":
            replica.failed(self.slots, self.record.key)
        else:
            replica.finished_without_verdict(self.slots, self.record.key)
        self.metrics.upstream_error(self.deployment.name, replica.name, error)
        self.metrics.replica_health(self.deployment.name, replica)
        await self.events.aclose()

    async def abandon(self) -> None:
        """Ended by something that says nothing of the replica (the client gone, a gateway error)."""
        self.watchdog.stop()
        self.replica.finished_without_verdict(self.slots, self.record.key)
        await self.events.aclose()
