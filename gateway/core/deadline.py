"""A deadline for a run of waits (the reads of one upstream answer, the waits for a backend's
next event), kept by one timer for the whole run.

`asyncio.timeout_at` around each wait made, moved and cancelled a timer per chunk (and entered
and left a context): about a tenth of what the backend spent per relayed chunk with 8,000
streams open. Here the timer is armed once and re-armed only when it fires before a deadline
that has moved on. The openai-compatible backend times its reads with it, the attempt
(gateway/fleet/attempt.py) its waits for the backend.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

# The task running now on `loop`. Before Python 3.12 `asyncio.current_task()` is a Python function
# that looks the running loop up first: measured at about four coroutine calls, once a relayed
# chunk for each wait timed. Asked of asyncio's own table of running tasks, it is a dict lookup.
task_of: Callable[[asyncio.AbstractEventLoop], asyncio.Task | None] = (
    asyncio.current_task
    if sys.version_info >= (3, 12) or not hasattr(asyncio.tasks, "_current_tasks")
    else asyncio.tasks._current_tasks.get
)


class DeadlinePassed(TimeoutError):
    """A wait outlasted its deadline (a TimeoutError of this deadline's own, told apart from
    one that what was awaited raised)."""


class Deadline:
    """Waits that must end by `when` (monotonic, the loop's clock); `when` may move."""

    __slots__ = ("fired", "handle", "loop", "waiting", "when")

    def __init__(self, when: float) -> None:
        self.loop = asyncio.get_running_loop()
        self.when = when
        self.handle: asyncio.TimerHandle | None = None
        self.waiting: asyncio.Task | None = None  # the task in a wait now
        self.fired = False

    async def wait(self, reading: Awaitable[T]) -> T:
        """What `reading` gives, or DeadlinePassed once the deadline passes while it waits."""
        handle = self.handle
        if handle is None or handle.when() > self.when:
            if handle is not None:
                handle.cancel()
            self.handle = self.loop.call_at(self.when, self.check)
        task = self.waiting = task_of(self.loop)
        assert task is not None
        cancelling = task.cancelling()
        try:
            return await reading
        except asyncio.CancelledError:
            # ours only if no one else asked for the cancellation too (as asyncio.timeout decides)
            if self.fired and task.uncancel() <= cancelling:
                raise DeadlinePassed from None
            raise
        finally:
            self.waiting = None
            self.fired = False

    def arm(self, task: asyncio.Task, when: float) -> None:
        """`wait` taken apart, for a loop that waits at every turn (a stream's relay): `task`'s
        next wait must end by `when`, until `disarm`; a CancelledError meanwhile is this
        deadline's if `passed` says so. No coroutine a wait, no task looked up."""
        self.when = when
        handle = self.handle
        if handle is None or handle.when() > when:
            if handle is not None:
                handle.cancel()
            self.handle = self.loop.call_at(when, self.check)
        self.waiting = task

    def disarm(self) -> None:
        self.waiting = None
        self.fired = False

    def passed(self, task: asyncio.Task, cancelling: int) -> bool:
        """Whether the cancellation of the armed wait was this deadline's (and no one else's:
        `cancelling` is the task's count before the wait, as in `wait`)."""
        return self.fired and task.uncancel() <= cancelling

    def check(self) -> None:
        self.handle = None
        if self.waiting is None:
            return  # not waiting now: the next wait arms the timer again
        if self.loop.time() >= self.when:
            self.fired = True
            self.waiting.cancel()
        else:
            self.handle = self.loop.call_at(self.when, self.check)

    def close(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None
