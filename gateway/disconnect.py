"""Hearing a client go away while its answer is being made, so the upstream's work stops too.

A listener is one more task per request, so it starts only when the answer is slow: a fast
answer costs one timer, armed and cancelled. (A stream has its listener from its first byte:
gateway/streaming.py.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from starlette.types import Receive

from gateway.core.errors import ClientGone

T = TypeVar("T")
LISTEN_AFTER_SECONDS = 0.05


async def unless_client_leaves(
    work: Awaitable[T], receive: Receive, after: float = LISTEN_AFTER_SECONDS
) -> T:
    """`work`, awaited in this task; if the client hangs up first (heard from `after` seconds
    on), the work is cancelled, its upstream request with it, and ClientGone raised instead."""
    task = asyncio.current_task()
    assert task is not None
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
