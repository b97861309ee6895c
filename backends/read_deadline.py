"""A deadline for the reads of one upstream answer, kept by one timer for the whole answer.

`asyncio.timeout_at` around each read made, moved and cancelled a timer per chunk (and entered
and left a context): about a tenth of what the backend spent per relayed chunk with 8,000
streams open. Here the timer is armed once and re-armed only when it fires before a deadline
that has moved on, as the attempt's watchdog does for the wait for the backend's next event.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


class ReadDeadline:
    """Reads that must end by `when` (monotonic, the loop's clock); `when` may move."""

    __slots__ = ("fired", "handle", "loop", "waiting", "when")

    def __init__(self, when: float) -> None:
        self.loop = asyncio.get_running_loop()
        self.when = when
        self.handle: asyncio.TimerHandle | None = None
        self.waiting: asyncio.Task | None = None  # the task in a read now
        self.fired = False

    async def read(self, reading: Awaitable[T]) -> T:
        """What `reading` gives, or TimeoutError once the deadline passes while it waits."""
        handle = self.handle
        if handle is None or handle.when() > self.when:
            if handle is not None:
                handle.cancel()
            self.handle = self.loop.call_at(self.when, self.check)
        task = self.waiting = asyncio.current_task()
        assert task is not None
        cancelling = task.cancelling()
        try:
            return await reading
        except asyncio.CancelledError:
            # ours only if no one else asked for the cancellation too (as asyncio.timeout decides)
            if self.fired and task.uncancel() <= cancelling:
                raise TimeoutError from None
            raise
        finally:
            self.waiting = None
            self.fired = False

    def check(self) -> None:
        self.handle = None
        if self.waiting is None:
            return  # not reading now: the next read arms the timer again
        if self.loop.time() >= self.when:
            self.fired = True
            self.waiting.cancel()
        else:
            self.handle = self.loop.call_at(self.when, self.check)

    def close(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None
