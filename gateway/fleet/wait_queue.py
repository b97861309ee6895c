"""The requests waiting for a replica of one deployment to free a slot: bounded in length and in
time, and fair between the keys that wait. A replica that frees a slot wakes the head of the key
that holds the fewest of the deployment's slots now (on a tie, the keys take turns; each key's
requests keep their order), so a key with many requests running or waiting does not make
another's wait behind all of them. A full queue takes a request
from a key holding fewer places than the key holding the most, in the place of that key's
newest request (which gets the queue-full answer), so one key cannot shut the others out.

A request that leaves (its client went away, or its wait ran out) leaves the line, and one woken
that leaves passes its turn on, so a free slot is never left with requests asleep."""

from __future__ import annotations

import asyncio
from collections import Counter, deque

Turn = asyncio.Future[None]


class QueueFull(Exception):
    """As many requests wait as the queue holds, and none may give its place up to this one."""


class WaitQueue:
    """Created and used in one event loop (a worker's)."""

    __slots__ = ("by_key", "length", "running", "timeout", "waiting")

    def __init__(self, length: int, timeout: float) -> None:
        self.length = length
        self.timeout = timeout
        self.by_key: dict[str, deque[Turn]] = {}  # in the order the keys take their turns
        self.waiting = 0
        self.running: Counter[str] = Counter()  # the slots each key holds (gateway.fleet.router)

    def __len__(self) -> int:
        return self.waiting

    @property
    def waiters(self) -> int:
        return self.waiting

    async def wait(self, deadline: float, first: bool = False, key: str = "") -> None:
        """Until a slot may be free: raises QueueFull at once when the queue is full (or later,
        when this request's place goes to another key's), TimeoutError at `deadline` (the loop's
        clock). `first`: a request woken whose slot was taken again waits at the head, not at
        the back."""
        if self.waiting >= self.length and not first:
            self.make_room_for(key)
        turn: Turn = asyncio.get_running_loop().create_future()
        line = self.by_key.get(key)
        if line is None:
            line = self.by_key[key] = deque()
        if first:
            line.appendleft(turn)
            self.by_key = {key: line, **self.by_key}  # its key's turn comes next
        else:
            line.append(turn)
        self.waiting += 1
        try:
            async with asyncio.timeout_at(deadline):
                await turn
        except BaseException:
            if turn.done() and not turn.cancelled() and turn.exception() is None:
                self.wake()  # woken, but leaving: the turn goes to the next one
            else:
                self.leave(key, turn)
            raise

    def make_room_for(self, key: str) -> None:
        """The newest place of the key holding the most, given up to `key` if that key holds
        more than one place beyond what `key` would; else QueueFull."""
        if not self.by_key:  # a queue of no places (`queue: 0`)
            raise QueueFull
        mine = len(self.by_key.get(key, ()))
        most, line = max(((len(line), line) for line in self.by_key.values()), key=lambda pair: pair[0])
        if most <= mine + 1:
            raise QueueFull
        displaced = line.pop()
        self.waiting -= 1
        self.drop_empty()
        displaced.set_exception(QueueFull())

    def leave(self, key: str, turn: Turn) -> None:
        line = self.by_key.get(key)
        if line is not None and turn in line:  # (a wake or a displacement may have taken it)
            line.remove(turn)
            self.waiting -= 1
            self.drop_empty()

    def drop_empty(self) -> None:
        for key in [key for key, line in self.by_key.items() if not line]:
            del self.by_key[key]

    def wake(self) -> None:
        """A slot is free: the head of the key holding the fewest slots may take it (the first
        such in turn); that key's turn then goes to the back."""
        running = self.running
        while self.by_key:
            key = min(self.by_key, key=running.__getitem__)  # the first of the least, in turn
            line = self.by_key[key]
            turn = line.popleft()
            self.waiting -= 1
            del self.by_key[key]
            if line:
                self.by_key[key] = line  # to the back of the turns
            if not turn.done():
                turn.set_result(None)
                return
