"""The requests waiting for a replica of one deployment to free a slot: first come, first served,
bounded in length and in time. A replica that frees a slot wakes the request at the head; a
request that leaves (its client went away, or its wait ran out) leaves the line, and one woken
that leaves passes its turn on, so a free slot is never left with requests asleep."""

from __future__ import annotations

import asyncio
from collections import deque


class QueueFull(Exception):
    """As many requests wait as the queue holds."""


class WaitQueue:
    """Created and used in one event loop (a worker's)."""

    __slots__ = ("length", "timeout", "waiters")

    def __init__(self, length: int, timeout: float) -> None:
        self.length = length
        self.timeout = timeout
        self.waiters: deque[asyncio.Future[None]] = deque()

    def __len__(self) -> int:
        return len(self.waiters)

    async def wait(self, deadline: float, first: bool = False) -> None:
        """Until a slot may be free: raises QueueFull at once when the queue is full, TimeoutError
        at `deadline` (the loop's clock). `first`: a request woken whose slot was taken again
        waits at the head, not at the back."""
        if len(self.waiters) >= self.length and not first:
            raise QueueFull
        turn = asyncio.get_running_loop().create_future()
        if first:
            self.waiters.appendleft(turn)
        else:
            self.waiters.append(turn)
        try:
            async with asyncio.timeout_at(deadline):
                await turn
        except BaseException:
            if turn.done() and not turn.cancelled():
                self.wake()  # woken, but leaving: the turn goes to the next one
            elif turn in self.waiters:  # (a wake may have dropped it already, cancelled)
                self.waiters.remove(turn)
            raise

    def wake(self) -> None:
        """A slot is free: the request at the head may take it."""
        waiters = self.waiters
        while waiters:
            turn = waiters.popleft()
            if not turn.done():
                turn.set_result(None)
                return
