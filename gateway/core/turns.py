"""Whether a task has let its event loop run since it last asked.

A relay that never waits (a backend with its events ready, a client that takes them at once)
must give the loop a turn now and then, or no other request is served and no disconnect is
heard. One that waits for every event has given it already, and a turn given anyway is a whole
resumption of the request's task: a callback, a loop turn, and every frame of the request's
stack resumed and suspended again. With a thousand slow streams that was about a tenth of a
relayed chunk's CPU. `LoopTurns` tells the two apart with one callback per turn of the loop,
shared by every relay on it, not one per relay, and with none where a task says it has just
waited: an upstream's read that found nothing yet and came back with bytes
(backends/http/client.py) counts a turn itself. A relay at a model's pace then asks for no
callback at all, and its loop turns once a chunk, not twice. The edge reads the count too: a
connection writes a stream's piece at once at most once a turn (gateway/server/edge_writing.py).
"""

from __future__ import annotations

import asyncio


class LoopTurns:
    """The turns of one event loop, counted while anyone asks, and whenever a task says it
    waited.

    `ask()` makes sure a callback is due at the loop's next turn, and gives the count as it is.
    The callback runs only once the task that asked has given the loop back, and `waited()` is
    said only by a task back from a wait, so a task that later finds `count` moved knows it has
    let the loop run since it read it. (Not the converse: a wait nobody said leaves the count
    where it was until a callback asked for moves it.)"""

    __slots__ = ("count", "loop", "pending")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.count = 0
        self.pending = False  # a callback is due (asked for by this or another task)

    def ask(self) -> int:
        if not self.pending:
            self.pending = True
            self.loop.call_soon(self.turned)
        return self.count

    def turned(self) -> None:
        self.pending = False
        self.count += 1

    def waited(self) -> None:
        """Said by a task just back from a wait it knows it made (an upstream's read that found
        nothing yet): the loop has turned, counted with no callback. Never said otherwise."""
        self.count += 1


def turns_of(loop: asyncio.AbstractEventLoop) -> LoopTurns:
    """The loop's `LoopTurns`, one for all who ask on it (one callback a turn between them).
    A process serves on one loop; where loops in two threads ask in turn (tests), each gets one
    of its own loop's, only not always the same one."""
    global shared
    turns = shared  # read once: another thread may change `shared` between two reads
    if turns is None or turns.loop is not loop:
        turns = shared = LoopTurns(loop)
    return turns


shared: LoopTurns | None = None  # the serving loop's
