"""The HTTP connection itself: uvicorn's httptools protocol with limits on what a client may hold.

uvicorn reads a request's header block without a size limit and waits for headers and bodies
forever; a client could hold memory (one 128 MB header) or a connection (a slowloris, a chunked
body that never ends) as long as it liked, before any key was checked. Here:

- the header block (request line and headers) is capped: past `max_header_bytes` → 431;
- the headers must arrive within `header_timeout` seconds of the request's first byte, and the
  body within `body_timeout` of the headers → 408 (or a plain close once an answer has begun);
- an idle keep-alive connection closes after `keepalive_timeout`;
- a worker holds at most `max_connections` connections; the next is closed at once.

Errors found here, before any route is known (a request the parser refuses, a smuggling
attempt), are answered as JSON in the shape of the dialect the path belongs to, never plain text.

What the connection writes in one turn of the event loop goes out in one system call
(`CoalescingTransport`): uvicorn writes an answer's head and body apart, and a relayed stream's
chunks one by one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from gateway.config import ClientLimits

log = logging.getLogger("chatgate.edge")
# (status, message, path) → (body, media type), in the shape of the path's dialect
ErrorRenderer = Callable[[int, str, str], tuple[bytes, bytes]]


class Refused(Exception):
    """A request the edge answers itself, with this status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class CoalescingTransport:
    """A transport whose writes within one turn of the event loop are joined into one.

    Writes are held until the turn ends (`call_soon`); closing flushes first, aborting drops
    them. Everything else is the wrapped transport's. A system call costs several microseconds
    here: an answer's head and body in one write saved about a tenth of a small request."""

    __slots__ = ("held", "loop", "transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self.transport = transport
        self.loop = loop
        self.held: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self.held:
            self.loop.call_soon(self.flush)
        self.held.append(data)

    def flush(self) -> None:
        if self.held:
            data = b"".join(self.held) if len(self.held) > 1 else self.held[0]
            self.held = []
            if not self.transport.is_closing():
                self.transport.write(data)

    def close(self) -> None:
        self.flush()
        self.transport.close()

    def abort(self) -> None:
        self.held = []
        self.transport.abort()

    def write_eof(self) -> None:
        self.flush()
        self.transport.write_eof()

    def get_write_buffer_size(self) -> int:
        return self.transport.get_write_buffer_size() + sum(map(len, self.held))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


class EdgeProtocol(HttpToolsProtocol):
    def __init__(self, *args: Any, limits: ClientLimits, render_error: ErrorRenderer, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limits = limits
        self.render_error = render_error
        self.timeout_keep_alive = limits.keepalive_timeout  # type: ignore[assignment]  # a float works
        self.header_bytes = 0
        self.in_headers = True  # between a request's first byte (or the connection) and its headers
        self.header_bytes_received = 0
        self.reading_timer: asyncio.TimerHandle | None = None
        self.reading: tuple[float, float, str] | None = None  # (deadline, seconds, what)
        self.refused = False

    # ----- connections ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if len(self.connections) >= self.limits.max_connections:
            log.warning("connection refused: %d connections held already", len(self.connections))
            transport.close()
            self.refused = True
            return
        super().connection_made(CoalescingTransport(transport, self.loop))  # type: ignore[arg-type]
        self.start_timer(self.limits.header_timeout, "a request")

    def connection_lost(self, exc: Exception | None) -> None:
        if self.refused:
            return
        self.cancel_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return
        self._unset_keepalive_if_required()
        if self.in_headers:
            # httptools holds a header whole before handing it over: count what arrives, so a
            # 128 MB header is refused at its first 64 KiB, not buffered
            end = data.find(b"\r\n\r\n")
            self.header_bytes_received += len(data) if end < 0 else end
            if self.header_bytes_received > self.limits.max_header_bytes:
                self.answer(431, f"The request's headers exceed {self.limits.max_header_bytes} bytes.")
                return
        try:
            self.parser.feed_data(data)
        except Refused as refusal:
            self.answer(refusal.status, refusal.message)
        except httptools.HttpParserCallbackError as error:
            cause = error.__context__
            if isinstance(cause, Refused):
                self.answer(cause.status, cause.message)
            else:
                self.answer(400, "The request could not be read as HTTP/1.1.")
        except httptools.HttpParserUpgrade:
            self.answer(400, "Protocol upgrades are not supported here.")
        except httptools.HttpParserError:
            self.answer(400, "The request could not be read as HTTP/1.1.")

    def send_400_response(self, msg: str) -> None:
        self.answer(400, "The request could not be read as HTTP/1.1.")

    def answer(self, status: int, message: str) -> None:
        """Answer from the edge, in the shape of the path's dialect, and close."""
        self.cancel_timer()
        if self.transport.is_closing():
            return
        path = self.path_so_far()
        body, media_type = self.render_error(status, message, path)
        head = [
            STATUS_LINE[status],
            b"content-type: " + media_type + b"\r\n",
            b"content-length: " + str(len(body)).encode() + b"\r\n",
            b"connection: close\r\n\r\n",
        ]
        self.transport.write(b"".join(head) + body)
        self.transport.close()
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True
            self.cycle.message_event.set()

    def path_so_far(self) -> str:
        url = getattr(self, "url", b"") or b""
        try:
            return httptools.parse_url(url).path.decode("ascii", "replace") if url else ""
        except httptools.HttpParserInvalidURLError:
            return ""

    # ----- the header block ------------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.header_bytes = 0
        self.in_headers = True
        self.start_timer(self.limits.header_timeout, "the request's headers")

    def on_url(self, url: bytes) -> None:
        self.header_bytes += len(url)
        self.check_header_size()
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self.header_bytes += len(name) + len(value) + 4
        self.check_header_size()
        super().on_header(name, value)

    def check_header_size(self) -> None:
        if self.header_bytes > self.limits.max_header_bytes:
            raise Refused(431, f"The request's headers exceed {self.limits.max_header_bytes} bytes.")

    def on_headers_complete(self) -> None:
        self.in_headers = False
        self.header_bytes_received = 0
        self.start_timer(self.limits.body_timeout, "the request's body")
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self.stop_timer()
        self.in_headers = True  # what comes next is the next request's header block
        super().on_message_complete()

    # ----- time limits -----------------------------------------------------------------------

    def start_timer(self, seconds: float, what: str) -> None:
        """Time what is being read now. One timer per connection, re-armed lazily (when it
        fires early for a deadline that moved on): not a timer made and cancelled per request."""
        deadline = self.loop.time() + seconds
        self.reading = (deadline, seconds, what)
        timer = self.reading_timer
        if timer is None or timer.when() > deadline:
            if timer is not None:
                timer.cancel()
            self.reading_timer = self.loop.call_at(deadline, self.check_reading)

    def stop_timer(self) -> None:
        """Nothing is being read: the armed timer, when it fires, finds nothing to time."""
        self.reading = None

    def cancel_timer(self) -> None:
        self.reading = None
        if self.reading_timer is not None:
            self.reading_timer.cancel()
            self.reading_timer = None

    def check_reading(self) -> None:
        self.reading_timer = None
        if self.reading is None:
            return
        deadline, seconds, what = self.reading
        if self.loop.time() < deadline:
            self.reading_timer = self.loop.call_at(deadline, self.check_reading)
            return
        self.reading = None
        self.too_slow(seconds, what)

    def too_slow(self, seconds: float, what: str) -> None:
        if self.transport.is_closing():
            return
        if self.cycle is not None and self.cycle.response_started:
            self.transport.close()  # an answer has begun: nothing in shape can follow
            return
        self.answer(408, f"The client took longer than {seconds:g} s to send {what}.")
