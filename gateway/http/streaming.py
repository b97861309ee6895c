"""A streamed answer sent from the request's own task, its body written by one coroutine.

Starlette's StreamingResponse (under uvicorn's ASGI 2.3) starts an anyio task group and a new
task for the body on every stream, which was a fifth of the time to the first chunk here. This
sends the head and the chunks from the calling task at once. When the client goes away the
sending is cancelled, so a stalled upstream is hung up on promptly: by the connection itself
behind the gateway's edge (its ClientWatch, gateway/core/disconnect.py: nothing made per stream),
else by one plain task listening on `receive`. The body is not an iterator of chunks but what
writes them (`Body`): the chat flow's relay loop writes each chunk itself, with no generator
between it and the connection. Behind the edge it writes straight to the connection
(`PieceWriter`, from the server's `piece_writer`): no ASGI message or coroutine a chunk.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Protocol

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from gateway.core.disconnect import ClientWatch, client_watch
from gateway.core.errors import ClientGone
from gateway.telemetry.record import RequestRecord


class PieceWriter(Protocol):
    """Writes one piece of a stream's body (never empty). What it returns, when not None, is
    awaited before the next piece: the client is slow to take them.

    `last`: the stream's end follows in the same turn of the loop (its done line, the body's
    end), so the piece may wait for them and go out in one write; any other piece may go out
    at once."""

    def __call__(self, piece: bytes, last: bool = False, /) -> Awaitable[None] | None: ...


# Writes a stream's pieces, once the head went out; the response writes the end.
Body = Callable[[PieceWriter], Awaitable[None]]


def piece_writer(send: Send) -> PieceWriter:
    """How a stream's pieces are written: by the server's own writer where it offers one (the
    edge's, gateway/server/edge_writing.py: `send`'s owner has `piece_writer`), else each as an
    `http.response.body` message with `more_body`.

    The edge's saves a message, a coroutine and uvicorn's checks of every message for each
    piece: about 5 % of a streamed request's instructions (bench.instructions --stream)."""
    owner = getattr(send, "__self__", None)
    offered = getattr(owner, "piece_writer", None)
    if offered is not None and (write := offered()) is not None:
        return write

    def sent(data: bytes, last: bool = False) -> Awaitable[None]:
        return send({"type": "http.response.body", "body": data, "more_body": True})

    return sent


class EventStreamResponse(Response):
    def __init__(
        self,
        body: Body,
        media_type: str,
        raw_headers: list[tuple[bytes, bytes]],
        record: RequestRecord | None = None,
        on_end: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.record = record  # says how the stream ended, when the client ended it
        self.on_end = on_end  # called once the stream has ended, however it ended
        self.write_body = body
        self.status_code = 200
        self.media_type = media_type
        self.background = None
        self.init_headers()
        self.raw_headers += raw_headers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        task = asyncio.current_task()
        assert task is not None
        watch = client_watch(scope)
        if watch is None:  # under another server: a listener of its own
            watch = ClientWatch()
            listener: asyncio.Task[None] | None = asyncio.get_running_loop().create_task(
                listening(receive, watch)
            )
        else:  # behind the edge: the connection cancels the sending when the client goes
            listener = None
            if watch.gone:
                task.cancel()
        watch.task = task
        try:
            await send(
                {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
            )
            # the head went through every wrapper of `send`; the body's pieces need none of them
            # (the front door's adds the request id to the head only)
            body_send = getattr(send, "body_send", send)
            await self.write_body(piece_writer(body_send))
            await body_send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not watch.gone or task.cancelling() != 1:
                raise
            task.uncancel()  # the client went away: there is no one left to answer
            if self.record is not None and not self.record.error_code:
                self.record.error_code = ClientGone.code
        finally:
            watch.task = None  # only while suspended in the sending above (one thread)
            if listener is not None:
                listener.cancel()
            if self.on_end is not None:
                await self.on_end()


async def listening(receive: Receive, watch: ClientWatch) -> None:
    """The client's channel read until it says it is gone; then the watch's task is cancelled."""
    while (await receive())["type"] != "http.disconnect":
        pass
    watch.lost()
