"""Send a request to a deployment's replicas: pick one, retry and fall back while nothing has
reached the client, and wait in the deployment's queue when every replica is full. One try on
one replica is an `Attempt` (gateway/fleet/attempt.py): its timeouts, its relay and its verdict."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable

from gateway.core.canonical import ChatRequest, EventStream, Item, Usage
from gateway.core.deadline import task_of
from gateway.core.errors import GatewayError, GatewayTimeout, ServiceUnavailable
from gateway.core.turns import turns_of
from gateway.fleet.affinity import Prompt
from gateway.fleet.attempt import NOT_RETRIED, RETRYABLE, Attempt, verdict_of
from gateway.fleet.router import Replica, RoutedDeployment
from gateway.fleet.wait_queue import QueueFull
from gateway.telemetry.metrics import Metrics
from gateway.telemetry.record import RequestRecord
from gateway.telemetry.tracing import Tracing


def request_failed(error: GatewayError, replicas: int) -> GatewayError:
    """A request that failed the same way on every replica it tried: its own failure, counted
    against none of them (its status and headers kept)."""
    where = "its only replica" if replicas <= 1 else f"{replicas} replicas"
    message = f"{error.message.rstrip('.')} (on {where}; not tried again)."
    failure = type(error)(message, code=error.code, headers=error.headers)
    failure.__cause__ = error
    return failure


# Longest run of events relayed without giving the event loop a turn: at most twice this, as
# the relay asks only this often whether it has let the loop run (gateway/core/turns.py).
TURN_SECONDS = 0.005
OnUsage = Callable[[Usage], Awaitable[None]]  # hears an answer's usage as it passes (to charge it)
Take = Callable[[Item], None]  # takes a whole answer's items, one by one
# An answer's screen (its steps, gateway/policy/answer_steps.py): an item as it passes on
# (changed, or as it was), or None: nothing of it.
Screen = Callable[[Item], Item | None]


class QueueWait:
    """Whether a request waits in a deployment's queue for a replica with room: the dispatcher
    says so, the chat flow reads it (a request that waits has no status yet; its 503 must come
    before any byte of a 200)."""

    __slots__ = ("queued",)

    def __init__(self) -> None:
        self.queued = False


def retry_after(error: GatewayError) -> float:
    try:
        return float(error.headers.get("Retry-After", 0))
    except ValueError:
        return 0.0


class Tries:
    """What one request's attempts have learnt: the replicas tried, those it does not go back to,
    those that failed it (blamed only if another then answers), when busy ones said to return,
    and its place in a deployment's queue."""

    def __init__(
        self, deployment: RoutedDeployment, record: RequestRecord, metrics: Metrics, queue: QueueWait | None
    ) -> None:
        retries = deployment.config.retries
        self.most = retries.attempts
        self.budget_ends = time.monotonic() + retries.budget
        self.record, self.metrics = record, metrics
        self.count = 0
        self.tried: set[str] = set()
        self.never_again: set[str] = set()  # replicas this request does not go back to
        self.suspects: list[tuple[RoutedDeployment, Replica]] = []
        self.busy_until: dict[str, float] = {}
        self.last_error: GatewayError | None = None
        self.queued_until: float | None = None  # on the loop's clock: the end of its wait for room
        self.queue = queue
        self.slots = 1  # of a replica, on the deployment tried now: one, or one a choice
        self.prompt: Prompt | None = None  # as the deployment tried now reads it (affinity)

    @property
    def left(self) -> bool:
        return self.count < self.most

    def begin(self, replica: Replica) -> None:
        self.count += 1
        self.tried.add(replica.name)

    async def wait_if_busy(self, replica: Replica) -> None:
        """A replica that said when to come back (Retry-After) is waited for."""
        if replica.name in self.busy_until:
            wait = self.busy_until.pop(replica.name) - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)

    def failed(self, error: GatewayError, routed: RoutedDeployment, replica: Replica) -> None:
        """Before its first event, an attempt failed in a way worth another: raises when this
        request has no try left, or when it failed a second replica the same way (then it is the
        request's own failure)."""
        verdict = verdict_of(error)
        if verdict == "failed" or isinstance(error, GatewayTimeout):
            self.never_again.add(replica.name)  # it had its chance at this request
        if verdict == "failed":
            if self.suspects:
                raise request_failed(error, len(self.suspects) + 1) from None
            self.suspects.append((routed, replica))
        self.last_error = error
        wait = retry_after(error)
        if time.monotonic() + wait >= self.budget_ends or not self.left:
            raise self.failure(error) from None
        if wait:
            self.busy_until[replica.name] = time.monotonic() + wait
        self.record.retries += 1
        self.metrics.retry(routed.name)

    def failure(self, error: GatewayError) -> GatewayError:
        return request_failed(error, len(self.suspects)) if self.suspects else error

    def answered(self) -> None:
        """Another replica answered: those that failed this request are to blame."""
        for routed, suspect in self.suspects:
            suspect.count_failure()
            self.metrics.replica_health(routed.name, suspect)
        self.suspects.clear()


class Dispatcher:
    def __init__(self, metrics: Metrics, rng: random.Random, tracing: Tracing | None = None) -> None:
        self.metrics = metrics
        self.rng = rng
        self.tracing = tracing  # None: off

    async def events(
        self,
        deployment: RoutedDeployment,
        request: ChatRequest,
        record: RequestRecord,
        on_usage: OnUsage | None = None,
        queue: QueueWait | None = None,
        screen: Screen | None = None,
    ) -> EventStream:
        """A stream's items, passed on as they come: the one loop between the backend's events
        and the chat flow. It times each wait for the upstream itself (the attempt's watchdog
        armed and disarmed: no coroutine a wait), `on_usage` hears the usage as it passes (to
        charge for it), `screen` (the answer's steps) sees each item before it goes on; `queue`
        says while the request waits for a replica with room."""
        attempt, item = await self.started(deployment, request, record, on_usage, queue)
        upstream, deadline = attempt.events, attempt.watchdog.deadline
        loop = deadline.loop
        clock = loop.time
        turns = turns_of(loop)
        seen, asked, turn_at = turns.ask(), True, clock() + TURN_SECONDS
        async with attempt:
            while item is not None:
                if (charging := attempt.noted(item)) is not None:
                    await charging
                if screen is None:
                    yield item
                elif (passed := screen(item)) is not None:
                    yield passed
                if clock() >= turn_at:
                    # A backend with events ready (echo, a buffered upstream) and a client that
                    # takes them without waiting (or has gone, so sends return at once) would
                    # never suspend: give the loop a turn, so other requests are served and a
                    # disconnect is heard (it cancels this task here). A relay whose count moved
                    # (a model's pace: its reads said they waited, or the turn asked for came)
                    # has given it one already, and asks for no callback while that goes on; one
                    # whose count stood still asks, and gives a turn if it stands still again.
                    if turns.count != seen:
                        seen, asked = turns.count, False
                    else:
                        if asked:
                            await asyncio.sleep(0)
                        seen, asked = turns.ask(), True
                    turn_at = clock() + TURN_SECONDS
                # the task that asks for the next item (the first ones are asked for by the chat
                # flow's wait for the first token, the rest by the request's own task)
                task = task_of(loop)
                assert task is not None
                cancelling = task.cancelling()
                attempt.arm(task)
                try:
                    item = await upstream.__anext__()
                except StopAsyncIteration:
                    item = None
                except asyncio.CancelledError:
                    if deadline.passed(task, cancelling):
                        raise attempt.watchdog.timed_out() from None
                    raise
                finally:
                    deadline.disarm()

    async def complete(
        self,
        deployment: RoutedDeployment,
        request: ChatRequest,
        record: RequestRecord,
        take: Take,
        on_usage: OnUsage | None = None,
        screen: Screen | None = None,
    ) -> None:
        """A whole answer (a request not streamed), its items handed to `take` in the request's
        own task (which may refuse more: an answer too large), under the same timeouts, verdicts
        and `screen` as a stream: no generator between the backend's events and the handler."""
        attempt, item = await self.started(deployment, request, record, on_usage, None)
        async with attempt:
            while item is not None:
                if (charging := attempt.noted(item)) is not None:
                    await charging
                if screen is None:
                    take(item)
                elif (passed := screen(item)) is not None:
                    take(passed)
                item = await attempt.next_item()

    async def started(
        self,
        deployment: RoutedDeployment,
        request: ChatRequest,
        record: RequestRecord,
        on_usage: OnUsage | None,
        queue: QueueWait | None,
    ) -> tuple[Attempt, Item | None]:
        """The attempt that gave the answer's first event, and that event.

        Before the first event, a failed attempt is tried again elsewhere by what it says of the
        replica (`verdict_of`): busy → another replica, or the same after its Retry-After; down
        (unreachable, or no answer in time) → ejected at once, another replica; failed (a 5xx, a
        broken answer) → never that replica again for this request, and one more attempt on
        another. The failure is held against the replica only if another one then answers: a
        request that fails the same way everywhere it went is that request's failure."""
        deadline = time.monotonic() + deployment.config.timeouts.total
        tries = Tries(deployment, record, self.metrics, queue)
        chain = deployment.chain()
        for routed in chain:
            tries.slots = routed.slots_for(request)
            tries.prompt = routed.prompt_of(request)
            while tries.left:
                last_resort = routed is chain[-1]
                # at once when a replica has room and nobody waits (no coroutine for the rest)
                replica = (
                    self.choose(
                        routed, tries.tried, tries.never_again, last_resort, tries.slots, tries.prompt
                    )
                    if not routed.queue
                    else None
                )
                if replica is None:
                    replica = await self.replica_for(routed, tries, last_resort)
                    if replica is None:
                        break
                if tries.busy_until:
                    await tries.wait_if_busy(replica)
                tries.begin(replica)
                attempt = Attempt(
                    routed, replica, request, record, deadline, self.metrics, self.tracing, on_usage
                )
                try:
                    first = await attempt.first_item()
                except NOT_RETRIED as error:
                    await attempt.failed(error, verdict="none")
                    attempt.end_span()
                    raise
                except RETRYABLE as error:
                    await attempt.failed(error, verdict_of(error))
                    attempt.end_span()
                    tries.failed(error, routed, replica)
                    continue
                except BaseException:
                    await attempt.abandon()
                    attempt.end_span()
                    raise
                tries.answered()
                return attempt, first
        if tries.last_error is not None:
            raise tries.failure(tries.last_error)
        raise ServiceUnavailable(
            f"No healthy replica of '{deployment.name}' can take the request now.",
            code="NoHealthyReplica",
            headers={"Retry-After": str(max(1, int(deployment.config.health.cooldown)))},
        )

    async def replica_for(self, routed: RoutedDeployment, tries: Tries, last_resort: bool) -> Replica | None:
        """The replica for the next attempt on `routed`, after waiting in its queue when every
        replica is full; None when `routed` has none to offer (the chain goes on)."""
        while True:
            # a new request does not pass those already waiting
            behind = tries.queued_until is None and len(routed.queue) > 0
            replica = None
            if not behind:
                replica = self.choose(
                    routed, tries.tried, tries.never_again, last_resort, tries.slots, tries.prompt
                )
            if replica is not None:
                return replica
            if not behind and not routed.full(tries.never_again, tries.slots):
                return None
            if tries.queued_until is None:
                tries.queued_until = asyncio.get_running_loop().time() + routed.queue.timeout
                await self.wait_for_room(routed, tries.queue, tries.queued_until, key=tries.record.key)
            else:  # woken, and the room went to another (or is on a replica it left)
                await self.wait_for_room(
                    routed, tries.queue, tries.queued_until, again=True, key=tries.record.key
                )

    async def wait_for_room(
        self,
        routed: RoutedDeployment,
        waiting: QueueWait | None,
        until: float,
        again: bool = False,
        key: str = "",
    ) -> None:
        """Wait in the deployment's queue until a replica frees a slot; a 503 with Retry-After
        when the queue is full (for this request's key: gateway/fleet/wait_queue.py) or the wait
        reaches `until`. `again`: woken before (and the slot taken by another, or on a replica
        this request may not go back to), it waits at the head.

        503, not 429: the deployment is busy, not this client over its own limits; clients and
        proxies retry a 503 with Retry-After elsewhere or later, as they do a busy upstream's."""
        queue = routed.queue
        if waiting is not None:
            waiting.queued = True
        self.metrics.waiting(routed.name, +1)
        try:
            await queue.wait(until, first=again, key=key)
        except QueueFull:
            raise ServiceUnavailable(
                f"Every replica of '{routed.name}' is busy and {len(queue)} requests wait already; "
                "try again later.",
                code="QueueFull",
                headers={"Retry-After": str(routed.drain_seconds())},
            ) from None
        except TimeoutError:
            raise ServiceUnavailable(
                f"No replica of '{routed.name}' had room for the request within "
                f"{queue.timeout:g} s; try again later.",
                code="QueueTimeout",
                headers={"Retry-After": str(routed.drain_seconds())},
            ) from None
        finally:
            if waiting is not None:
                waiting.queued = False
            self.metrics.waiting(routed.name, -1)

    def choose(
        self,
        routed: RoutedDeployment,
        tried: set[str],
        never_again: set[str],
        last_resort: bool,
        slots: int = 1,
        prompt: Prompt | None = None,
    ) -> Replica | None:
        """The next replica to try: one not tried yet; on the last deployment of the chain, one
        tried already (it may have been a blip), and with every replica ejected, one anyway
        (panic routing: an upstream that is back serves at once, not after its cool-down).
        `prompt`: the request's, where the deployment routes by prefix affinity."""
        replica = routed.pick(tried | never_again, self.rng, slots, prompt)
        if replica is None and last_resort:
            replica = routed.pick(never_again, self.rng, slots, prompt)
            if replica is None:
                replica = routed.pick_ejected(tried, never_again, self.rng, slots)
                if replica is not None:
                    self.metrics.panic(routed.name)
        if prompt is not None and prompt.outcome:
            self.metrics.affinity(routed.name, prompt.outcome)
            prompt.outcome = ""
        return replica
