"""Hearing a client go away while its answer is being made, so the upstream's work stops too.

Behind the gateway's own edge (`chatgate serve`), each connection has one `ClientWatch`: the
request waiting on its answer names its task there, and the connection, when it is lost, cancels
that task. Nothing is made per request: no listener task, no timer. Under another ASGI server
(no watch in the scope) a listener on `receive` starts when the answer is slow: a fast answer
costs one timer, armed and cancelled. (A stream has its listener from its first byte:
gateway/http/streaming.py.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Coroutine
from typing import TypeVar

from starlette.types import Receive, Scope

from gateway.core.errors import ClientGone

T = TypeVar("T")
LISTEN_AFTER_SECONDS = 0.05
SCOPE_KEY = "chatgate.client"  # in the scope's "extensions": the connection's ClientWatch


class ClientWatch:
    """A connection's client, watched: the task to cancel when it hangs up (one at a time: a
    connection's requests are answered one after another)."""

    __slots__ = ("gone", "task")

    def __init__(self) -> None:
        self.task: asyncio.Task | None = None
        self.gone = False

    def lost(self) -> None:
        """The connection is gone: the task waiting on its answer stops."""
        self.gone = True
        if self.task is not None:
            self.task.cancel()


def client_watch(scope: Scope) -> ClientWatch | None:
    """The connection's watch, where the edge keeps one."""
    extensions = scope.get("extensions")
    return None if extensions is None else extensions.get(SCOPE_KEY)


async def unless_client_leaves(
    work: Awaitable[T],
    receive: Receive,
    watch: ClientWatch | None = None,
    after: float = LISTEN_AFTER_SECONDS,
) -> T:
    """`work`, awaited in this task; if the client hangs up first, the work is cancelled, its
    upstream request with it, and ClientGone raised instead. `watch`: the connection's (heard at
    once); without one, a listener on `receive` (heard from `after` seconds on)."""
    task = asyncio.current_task()
    assert task is not None
    if watch is not None:
        if watch.gone:
            if isinstance(work, Coroutine):
                work.close()  # never begun: nothing to hang up on
            raise ClientGone("The client closed the connection before the answer was ready.")
        watch.task = task
        try:
            return await work
        except asyncio.CancelledError:
            if not watch.gone or task.cancelling() != 1:
                raise  # cancelled for another reason too (a shutdown)
            task.uncancel()
            raise ClientGone("The client closed the connection before the answer was ready.") from None
        finally:
            watch.task = None
    return await listening(work, receive, task, after)


async def listening(work: Awaitable[T], receive: Receive, task: asyncio.Task, after: float) -> T:
    loop = asyncio.get_running_loop()
    gone = False
    listener: asyncio.Task[None] | None = None

    async def listen() -> None:
        nonlocal gone
        while (await receive())["type"] != "http.disconnect":
            pass
        gone = True
        task.cancel()

    def start_listening() -> None:
        nonlocal listener
        listener = loop.create_task(listen())

    timer = loop.call_later(after, start_listening)
    try:
        return await work
    except asyncio.CancelledError:
        if not gone:
            raise
        task.uncancel()
        raise ClientGone("The client closed the connection before the answer was ready.") from None
    finally:
        timer.cancel()
        if listener is not None:
            listener.cancel()
