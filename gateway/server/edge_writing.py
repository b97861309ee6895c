"""How the edge writes: what one turn of the event loop writes goes out in one system call, a
socket holds little that its client has not taken, a client's progress in taking it can be
seen, a stream's pieces go straight to the connection, and an HTTP/1.0 answer of unknown length
runs to the connection's close."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import socket
import struct
import termios
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from uvicorn._types import ASGISendEvent
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from gateway.config.settings import ClientLimits
from gateway.core.turns import turns_of
from gateway.http.streaming import PieceWriter


def limit_unsent(sock: socket.socket, limits: ClientLimits) -> None:
    """What a connection's socket may hold that its client has not taken (TCP_NOTSENT_LOWAT,
    set on the listening socket: the connections it accepts inherit it, no call per connection).
    The kernel otherwise grows it to megabytes, and a stream to a client that reads nothing is
    computed that far ahead. Data in flight is not counted: a fast reader far away is not slowed."""
    option = getattr(socket, "TCP_NOTSENT_LOWAT", None)  # Linux
    if option is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, option, limits.unsent_bytes)


def unacknowledged(transport: asyncio.BaseTransport) -> int:
    """Bytes the socket holds that the client has not acknowledged (Linux's SIOCOUTQ; 0
    elsewhere). A slow reader's progress shows here first: the kernel wakes the writer only
    once half of `unsent_bytes` has gone."""
    sock = transport.get_extra_info("socket")
    if sock is None or not hasattr(termios, "TIOCOUTQ"):
        return 0
    with contextlib.suppress(OSError, ValueError):
        return int(struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0])
    return 0


class CoalescingTransport:
    """A transport whose writes within one turn of the event loop are joined into one.

    Writes are held until the turn ends (`call_soon`); closing flushes first, aborting drops
    them. Everything else is the wrapped transport's, passed on method by method: a class with
    `__getattr__` has every attribute of its own looked up the slow way (no specialised lookup),
    six times a relayed chunk. A system call costs several microseconds here: an answer's head
    and body in one write saved about a tenth of a small request."""

    __slots__ = ("closed_with_data", "held", "loop", "through_at", "transport", "turns")

    def __init__(
        self,
        transport: asyncio.Transport,
        loop: asyncio.AbstractEventLoop,
        closed_with_data: Callable[[], None],
    ) -> None:
        self.transport = transport
        self.loop = loop
        self.held: list[bytes] = []
        self.closed_with_data = closed_with_data  # the client has yet to take what is written
        self.turns = turns_of(loop)
        self.through_at = -1  # the turn of the last write at once (`write_through`)

    def write(self, data: bytes) -> None:
        if not self.held:
            self.loop.call_soon(self.flush)
        self.held.append(data)

    def write_through(self, data: bytes) -> None:
        """Written now if it is the turn's first, else held as `write` holds it: a stream's
        piece at a model's pace comes alone in its turn, and holding it cost a callback and its
        call for the same one system call. In a burst the rest of the turn's pieces are joined
        after the first, one system call more than holding them all. The turn is the loop's
        shared count (gateway/core/turns.py), which a relay's reads at a model's pace move
        themselves; the edge asks for no callback: a piece the count cannot yet tell from the
        last one's turn is held, and leaves at that turn's end as any held write does."""
        turns = self.turns
        if self.held or turns.count == self.through_at or self.transport.is_closing():
            self.write(data)
        else:
            self.through_at = turns.count
            self.transport.write(data)

    def flush(self) -> None:
        if self.held:
            data = b"".join(self.held) if len(self.held) > 1 else self.held[0]
            self.held = []
            if not self.transport.is_closing():
                self.transport.write(data)

    def close(self) -> None:
        self.flush()
        self.transport.close()
        if self.transport.get_write_buffer_size():
            self.closed_with_data()

    def abort(self) -> None:
        self.held = []
        self.transport.abort()

    def write_eof(self) -> None:
        self.flush()
        self.transport.write_eof()

    def writelines(self, pieces: Iterable[bytes]) -> None:
        self.write(b"".join(pieces))

    def get_write_buffer_size(self) -> int:
        return self.transport.get_write_buffer_size() + sum(map(len, self.held))

    # ----- the rest of asyncio.Transport, the wrapped transport's ----------------------------

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.transport.get_extra_info(name, default)

    def is_closing(self) -> bool:
        return self.transport.is_closing()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.transport.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self.transport.get_protocol()

    def is_reading(self) -> bool:
        return self.transport.is_reading()

    def pause_reading(self) -> None:
        self.transport.pause_reading()

    def resume_reading(self) -> None:
        self.transport.resume_reading()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self.transport.set_write_buffer_limits(high, low)

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self.transport.get_write_buffer_limits()

    def can_write_eof(self) -> bool:
        return self.transport.can_write_eof()


class PieceWritingCycle(RequestResponseCycle):
    """An HTTP/1.1 request's answer, which offers a stream a writer of its pieces of its own."""

    def piece_writer(self) -> PieceWriter | None:
        """Once a chunked answer's head went out: its pieces written straight to the connection,
        each a chunk, as uvicorn's `send` writes an `http.response.body` with `more_body`, with
        no message or coroutine a piece (gateway/http/streaming.py). None for any other answer
        (a HEAD's, one of known length, one that ended): its pieces go through `send`.

        As `send` does, it writes nothing once the client has gone, and has the writer wait
        (the flow's drain) while the connection holds more than its limit: `send` waits before
        a piece, this after one, so either way nothing more is made until the client takes some.

        A piece goes out at once when the turn holds nothing else to write (`write_through`);
        one with the stream's end to follow (`last`) waits for it, to go out in the same write."""
        if (
            not (self.response_started and self.chunked_encoding)
            or self.response_complete
            or self.scope["method"] == "HEAD"
        ):
            return None
        transport, flow = self.transport, self.flow
        through = transport.write_through if isinstance(transport, CoalescingTransport) else transport.write

        def write(data: bytes, last: bool = False) -> Awaitable[None] | None:
            if self.disconnected or not data:  # an empty chunk would end the body
                return None
            (transport.write if last else through)(b"%x\r\n%b\r\n" % (len(data), data))
            return flow.drain() if flow.write_paused else None

        return write


class CloseDelimitedCycle(RequestResponseCycle):
    """An HTTP/1.0 request's answer. HTTP/1.0 has no chunked encoding: an answer without a
    Content-Length (a stream) goes as is, and the connection's close ends it (uvicorn never
    keeps an HTTP/1.0 connection open)."""

    runs_to_close = False

    async def send(self, message: ASGISendEvent) -> None:
        if message["type"] == "http.response.start" and not self.response_started:
            headers = list(message.get("headers", ()))
            names = {name.lower() for name, _ in headers}
            if (
                b"content-length" not in names
                and message["status"] not in (204, 304)
                and self.scope["method"] != "HEAD"
            ):
                self.runs_to_close = True
                self.chunked_encoding = False  # uvicorn adds no Transfer-Encoding
                kept = [(name, value) for name, value in headers if name.lower() != b"transfer-encoding"]
                message = {"type": "http.response.start", "status": message["status"], "headers": kept}
        elif self.runs_to_close and message["type"] == "http.response.body":
            # uvicorn counts a body against its Content-Length; this one has none: each piece is
            # what is left of it
            self.expected_content_length = len(message.get("body", b""))
        await super().send(message)
