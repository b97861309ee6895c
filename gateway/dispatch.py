"""Send a request to a deployment's replicas: pick one, retry and fall back while nothing has
reached the client, enforce the time to first token, the idle gap and the total time, and
keep each replica's passive-health state."""

from __future__ import annotations

import asyncio
import random
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
from gateway.metrics import Metrics
from gateway.record import RequestRecord
from gateway.router import LiveDeployment, Replica
from gateway.tracing import Tracing
from gateway.wait_queue import QueueFull

if TYPE_CHECKING:
    from opentelemetry.trace import Span

# Longest run of events relayed without giving the event loop a turn.
TURN_SECONDS = 0.005
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


def request_failed(error: GatewayError, replicas: int) -> GatewayError:
    """A request that failed the same way on every replica it tried: its own failure, counted
    against none of them (its status and headers kept)."""
    where = "its only replica" if replicas <= 1 else f"{replicas} replicas"
    message = f"{error.message.rstrip('.')} (on {where}; not tried again)."
    failure = type(error)(message, code=error.code, headers=error.headers)
    failure.__cause__ = error
    return failure


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


def retry_after(error: GatewayError) -> float:
    try:
        return float(error.headers.get("Retry-After", 0))
    except ValueError:
        return 0.0


class Watchdog:
    """Times the waits for an upstream's next event with one timer per stream, not one per event.

    Only the wait for the upstream is timed (a slow client must not look like a slow model);
    the timer is re-armed lazily, when it fires and finds the deadline has moved on.
    """

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.handle: asyncio.TimerHandle | None = None
        self.deadline = 0.0
        self.waiting: asyncio.Task | None = None
        self.fired = False

    async def next(self, events: EventStream, timeout: float, what: str) -> Item | None:
        self.deadline = self.loop.time() + timeout
        if self.handle is None or self.handle.when() > self.deadline:
            if self.handle is not None:
                self.handle.cancel()
            self.handle = self.loop.call_at(self.deadline, self.check)
        self.waiting = asyncio.current_task()
        try:
            return await anext(events, None)
        except asyncio.CancelledError:
            if not self.fired:
                raise
            self.fired = False
            if self.waiting is not None:
                self.waiting.uncancel()
            raise GatewayTimeout(
                f"The model did not answer in time ({what}: {timeout:g}s).", code="UpstreamTimeout"
            ) from None
        finally:
            self.waiting = None

    def check(self) -> None:
        self.handle = None
        if self.waiting is None:
            return  # not waiting now: the next wait re-arms
        if self.loop.time() >= self.deadline:
            self.fired = True
            self.waiting.cancel()
        else:
            self.handle = self.loop.call_at(self.deadline, self.check)

    def stop(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None


class Dispatcher:
    def __init__(self, metrics: Metrics, rng: random.Random, tracing: Tracing | None = None) -> None:
        self.metrics = metrics
        self.rng = rng
        self.tracing = tracing  # None: off

    def attempt_span(
        self, record: RequestRecord, live: LiveDeployment, replica: Replica, request: ChatRequest
    ) -> Span | None:
        """A client span for one attempt, under the request's server span; the upstream gets its
        traceparent (with tracing off, the client's own goes on as it came)."""
        if self.tracing is None or record.span is None:
            return None
        model = request.model or live.model
        span = self.tracing.client_span(record.span, live.name, replica.name, live.config.backend, model)
        carried = self.tracing.traceparent(span)
        request.trace.traceparent = carried.get("traceparent", request.trace.traceparent)
        return span

    @staticmethod
    def attempt_failed(span: Span | None, error: GatewayError) -> None:
        if span is not None:
            from opentelemetry.trace import Status, StatusCode

            span.set_attributes({"error.type": error.code, "http.response.status_code": error.status})
            span.set_status(Status(StatusCode.ERROR, error.code))

    async def events(
        self,
        deployment: LiveDeployment,
        request: ChatRequest,
        record: RequestRecord,
        on_usage: Callable[[Usage], Awaitable[None]] | None = None,
    ) -> EventStream:
        """The answer's events; `on_usage` hears the usage as it passes (to charge for it).

        Before the first event, a failed attempt is tried again elsewhere by what it says of the
        replica (`verdict_of`): busy → another replica, or the same after its Retry-After; down
        (unreachable, or no answer in time) → ejected at once, another replica; failed (a 5xx, a
        broken answer) → never that replica again for this request, and one more attempt on
        another. The failure is held against the replica only if another one then answers: a
        request that fails the same way everywhere it went is that request's failure."""
        config = deployment.config
        started = time.monotonic()
        budget_ends = started + config.retries.budget
        deadline = started + config.timeouts.total
        attempts = 0
        tried: set[str] = set()
        never_again: set[str] = set()  # replicas this request does not go back to
        suspects: list[tuple[LiveDeployment, Replica]] = []  # failed it; marked if another answers
        busy_until: dict[str, float] = {}
        last_error: GatewayError | None = None
        chain = deployment.chain()
        queued_until: float | None = None  # on the loop's clock: the end of its wait for room
        for live in chain:
            while attempts < config.retries.attempts:
                # a new request does not pass those already waiting
                behind = queued_until is None and len(live.queue) > 0
                replica = None if behind else self.choose(live, tried, never_again, live is chain[-1])
                if replica is None:
                    if not behind and not live.full(never_again):
                        break
                    if queued_until is None:
                        queued_until = asyncio.get_running_loop().time() + live.queue.timeout
                        await self.wait_for_room(live, record, queued_until)
                    else:  # woken, and the room went to another (or is on a replica it left)
                        await self.wait_for_room(live, record, queued_until, again=True)
                    continue
                if replica.name in busy_until:  # it said when to come back; wait if we can
                    wait = busy_until.pop(replica.name) - time.monotonic()
                    if wait > 0:
                        await asyncio.sleep(wait)
                attempts += 1
                tried.add(replica.name)
                record.deployment, record.replica = live.name, replica.name
                replica.started()
                begun = time.monotonic()
                self.metrics.replica_health(live.name, replica)
                span = self.attempt_span(record, live, replica, request)
                try:
                    events = replica.backend.generate(request)
                    watchdog = Watchdog()
                    try:
                        first = await watchdog.next(
                            events, min(live.config.timeouts.first_token, deadline - time.monotonic()),
                            "time to first token",
                        )  # fmt: skip
                    except NOT_RETRIED as error:
                        await self.failed(live, replica, events, error, span, watchdog, verdict="none")
                        raise
                    except RETRYABLE as error:
                        verdict = verdict_of(error)
                        await self.failed(live, replica, events, error, span, watchdog, verdict)
                        if verdict == "failed" or isinstance(error, GatewayTimeout):
                            never_again.add(replica.name)  # it had its chance at this request
                        if verdict == "failed":
                            if suspects:  # a second replica failed it: the request's own failure
                                raise request_failed(error, len(suspects) + 1) from None
                            suspects.append((live, replica))
                        last_error = error
                        wait = retry_after(error)
                        if time.monotonic() + wait >= budget_ends or attempts >= config.retries.attempts:
                            raise request_failed(error, len(suspects)) if suspects else error from None
                        if wait:
                            busy_until[replica.name] = time.monotonic() + wait
                        record.retries += 1
                        self.metrics.retry(live.name)
                        continue
                    except BaseException:
                        watchdog.stop()
                        replica.finished_without_verdict()
                        await events.aclose()
                        raise
                    relayed = self.relay(
                        live, replica, events, first, deadline, record, begun, watchdog, on_usage, span,
                        request.prompt_tokens,
                    )  # fmt: skip
                    if suspects:  # another replica answered: those that failed it are to blame
                        for suspect_live, suspect in suspects:
                            suspect.count_failure()
                            self.metrics.replica_health(suspect_live.name, suspect)
                        suspects.clear()
                    async for event in relayed:
                        yield event
                    return
                finally:
                    if span is not None:
                        span.end()
        if last_error is not None:
            raise request_failed(last_error, len(suspects)) if suspects else last_error
        raise ServiceUnavailable(
            f"No healthy replica of '{deployment.name}' can take the request now.",
            code="NoHealthyReplica",
            headers={"Retry-After": str(max(1, int(deployment.config.health.cooldown)))},
        )

    async def wait_for_room(
        self, live: LiveDeployment, record: RequestRecord, until: float, again: bool = False
    ) -> None:
        """Wait in the deployment's queue until a replica frees a slot; a 503 with Retry-After
        when the queue is full or the wait reaches `until`. `again`: woken before (and the slot
        taken by another, or on a replica this request may not go back to), it waits at the head.

        503, not 429: the deployment is busy, not this client over its own limits; clients and
        proxies retry a 503 with Retry-After elsewhere or later, as they do a busy upstream's."""
        queue = live.queue
        record.queued = True
        self.metrics.waiting(live.name, +1)
        try:
            await queue.wait(until, first=again)
        except QueueFull:
            raise ServiceUnavailable(
                f"Every replica of '{live.name}' is busy and {len(queue)} requests wait already; "
                "try again later.",
                code="QueueFull",
                headers={"Retry-After": str(live.drain_seconds())},
            ) from None
        except TimeoutError:
            raise ServiceUnavailable(
                f"No replica of '{live.name}' had room for the request within "
                f"{queue.timeout:g} s; try again later.",
                code="QueueTimeout",
                headers={"Retry-After": str(live.drain_seconds())},
            ) from None
        finally:
            record.queued = False
            self.metrics.waiting(live.name, -1)

    def choose(
        self, live: LiveDeployment, tried: set[str], never_again: set[str], last_resort: bool
    ) -> Replica | None:
        """The next replica to try: one not tried yet; on the last deployment of the chain, one
        tried already (it may have been a blip), and with every replica ejected, one anyway
        (panic routing: an upstream that is back serves at once, not after its cool-down)."""
        replica = live.pick(tried | never_again, self.rng)
        if replica is None and last_resort:
            replica = live.pick(never_again, self.rng)
            if replica is None:
                replica = live.pick_ejected(tried, never_again, self.rng)
                if replica is not None:
                    self.metrics.panic(live.name)
        return replica

    async def relay(
        self,
        live: LiveDeployment,
        replica: Replica,
        events: EventStream,
        first: Item | None,
        deadline: float,
        record: RequestRecord,
        begun: float,
        watchdog: Watchdog,
        on_usage: Callable[[Usage], Awaitable[None]] | None,
        span: Span | None = None,
        prompt_tokens: int = 0,
    ) -> EventStream:
        """The rest of a stream that has begun: idle and total timeouts, health verdict. An
        answer that ends without its usage (the client gone, the upstream cut or timed out) is
        charged what was relayed: the prompt as admission counted it, and the tokens passed on
        (`delivered_tokens`)."""
        idle = live.config.timeouts.idle
        relayed = 0  # completion tokens passed on, while no usage has come
        usage_seen = False
        item = first
        clock = watchdog.loop.time
        turn_at = clock() + TURN_SECONDS
        try:
            while item is not None:
                for event in item if isinstance(item, list) else (item,):
                    if isinstance(event, TextDelta | RefusalDelta | ToolCallDelta):
                        record.first_token()
                        relayed += delivered_tokens(event)
                    elif isinstance(event, Usage):
                        usage_seen = True
                        record.prompt_tokens = event.prompt_tokens
                        record.completion_tokens = event.completion_tokens
                        if span is not None:
                            span.set_attributes(
                                {
                                    "gen_ai.usage.input_tokens": event.prompt_tokens,
                                    "gen_ai.usage.output_tokens": event.completion_tokens,
                                }
                            )
                        if on_usage is not None:
                            await on_usage(event)
                yield item
                if clock() >= turn_at:
                    # A backend with events ready (echo, a buffered upstream) and a client that
                    # takes them without waiting (or has gone, so sends return at once) would
                    # never suspend: give the loop a turn, so other requests are served and a
                    # disconnect is heard (it cancels this task here).
                    await asyncio.sleep(0)
                    turn_at = clock() + TURN_SECONDS
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise GatewayTimeout("The request took longer than its total time.", code="TotalTimeout")
                what = "idle between chunks" if idle <= remaining else "total time"
                item = await watchdog.next(events, min(idle, remaining), what)
        except NOT_RETRIED as error:
            await self.failed(live, replica, events, error, span, watchdog, verdict="none")
            raise
        except RETRYABLE as error:
            # the answer had begun: a replica that breaks off (or goes quiet) is to blame
            verdict = verdict_of(error)
            await self.failed(
                live, replica, events, error, span, watchdog, "failed-now" if verdict == "failed" else verdict
            )
            raise
        except GatewayError as error:
            self.attempt_failed(span, error)
            watchdog.stop()
            replica.finished_without_verdict()
            await events.aclose()
            raise
        except BaseException:  # the client went away (GeneratorExit, cancellation)
            watchdog.stop()
            replica.finished_without_verdict()
            await events.aclose()
            raise
        finally:
            if not usage_seen:  # closing just before the usage must not make the answer free
                delivered = Usage(prompt_tokens, relayed)
                record.prompt_tokens, record.completion_tokens = prompt_tokens, relayed
                if on_usage is not None:
                    await on_usage(delivered)
        watchdog.stop()
        replica.succeeded(time.monotonic() - begun)
        self.metrics.replica_health(live.name, replica)

    async def failed(
        self,
        live: LiveDeployment,
        replica: Replica,
        events: EventStream,
        error: GatewayError,
        span: Span | None,
        watchdog: Watchdog,
        verdict: Verdict = "failed-now",
    ) -> None:
        """An attempt that ended in an upstream error: its span, its timer, the replica's health
        (by the verdict: "down" ejects it, "failed-now" marks it, "failed" leaves the mark to
        the request's later attempts, "busy" and "none" mark nothing), the error counted, the
        upstream's stream closed."""
        self.attempt_failed(span, error)
        watchdog.stop()
        if verdict == "down":
            replica.eject()
        elif verdict == "failed-now":
            replica.failed()
        else:
            replica.finished_without_verdict()
        self.metrics.upstream_error(live.name, replica.name, error)
        self.metrics.replica_health(live.name, replica)
        await events.aclose()
