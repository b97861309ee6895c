"""The HTTP connection itself: uvicorn's httptools protocol with limits on what a client may hold.

uvicorn reads a request's header block without a size limit, waits for headers, bodies and
readers forever, and queues pipelined requests without bound; a client could hold memory (one
128 MB header, a 30 MB answer it never reads) or a connection (a slowloris, a chunked body that
never ends) as long as it liked, before any key was checked. Here:

- the header block (request line and headers) is capped: past `max_header_bytes` → 431;
- the headers must arrive within `header_timeout` seconds of the request's first byte, and the
  body within `body_timeout` of the headers → 408 (time in which the gateway itself does not
  read, as for a request waiting behind another's answer, does not count);
- a client that takes nothing of what waits for it for `write_timeout` seconds is cut off and
  what it held is freed; the socket holds at most `unsent_bytes` the client has not taken, so a
  stream to a slow reader waits for it instead of being computed ahead into the kernel;
- at most `max_pipelined` requests wait behind the one being answered; the next is 503;
- an idle keep-alive connection closes after `keepalive_timeout`;
- a worker holds at most `max_connections` connections. `probe_connections` more are taken
  only to answer /health, /ready and /metrics (anything else is 503, in shape); past those, a
  connection is closed at once;
- `Expect: 100-continue` with a Content-Length over `max_body_bytes` is 413 before any 100; any
  other expectation is 417; an HTTP/1.0 answer of unknown length (a stream) goes unframed and
  the connection's close ends it (HTTP/1.0 has no chunked encoding).

Errors found here, before any route is known (a request the parser refuses, a smuggling
attempt), are answered as JSON in the shape of the dialect the path belongs to, never plain
text, and never inside another answer: one owed while earlier answers are still being written
follows them, and nothing more is read.

How it writes (one system call a turn, the socket's unsent bytes, a stream's pieces, HTTP/1.0) is
edge_writing.py's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from gateway.config.settings import ClientLimits
from gateway.core.disconnect import SCOPE_KEY, ClientWatch
from gateway.core.memory import release_free_memory
from gateway.server.edge_writing import (
    CloseDelimitedCycle,
    CoalescingTransport,
    PieceWritingCycle,
    unacknowledged,
)

log = logging.getLogger("chatgate.edge")
# (status, message, path) → (body, media type), in the shape of the path's dialect
ErrorRenderer = Callable[[int, str, str], tuple[bytes, bytes]]
PROBES = frozenset({"/health", "/ready", "/metrics"})  # answered past the connection cap too
RELEASE_AFTER = 1.0  # seconds from a stalled connection's end to handing memory back
WRITE_LOOKS = 3  # looks at a stalled connection's progress per write_timeout
BURST_CONNECTIONS = 256  # connections held at once past which their going hands memory back


def ignore() -> None:
    """What a closed connection's transport calls instead of its protocol."""


class Refused(Exception):
    """A request the edge answers itself, with this status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Connections:
    """What a worker's connections share: how many are past `max_connections`, the most held at
    once since memory was last handed back, and whether it is about to be."""

    __slots__ = ("most", "past_cap", "release_planned")

    def __init__(self) -> None:
        self.past_cap = 0
        self.most = 0
        self.release_planned = False

    def held(self, count: int) -> None:
        if count > self.most:
            self.most = count

    def let_go(self, count: int, loop: asyncio.AbstractEventLoop) -> None:
        """Once a burst of connections is mostly gone (a quarter of its most left), hand back the
        memory it took: 8,000 streams left the heap 80 MB larger than idle, 20 MB of it free
        pages glibc keeps."""
        if self.most >= BURST_CONNECTIONS and count <= self.most // 4:
            self.most = count
            self.release_memory_soon(loop)

    def release_memory_soon(self, loop: asyncio.AbstractEventLoop) -> None:
        """Once a connection that held a stalled answer is gone, hand the heap's free pages back
        (glibc keeps them: 20 cut 4 MB answers left 80 MB, 13 after this), once for all that go
        within a second: it takes milliseconds on a large heap."""
        if not self.release_planned:
            self.release_planned = True
            loop.call_later(RELEASE_AFTER, self.release)

    def release(self) -> None:
        self.release_planned = False
        release_free_memory()


class EdgeProtocol(HttpToolsProtocol):
    def __init__(
        self,
        *args: Any,
        limits: ClientLimits,
        max_body_bytes: int,
        render_error: ErrorRenderer,
        shared: Connections,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.limits = limits
        self.max_body_bytes = max_body_bytes
        self.render_error = render_error
        self.shared = shared
        self.timeout_keep_alive = limits.keepalive_timeout  # type: ignore[assignment]  # a float works
        self.header_bytes = 0
        self.in_headers = True  # between a request's first byte (or the connection) and its headers
        self.header_bytes_received = 0
        self.expectation: bytes | None = None  # the request's Expect header
        self.reading_timer: asyncio.TimerHandle | None = None
        self.reading: tuple[float, float, str] | None = None  # (deadline, seconds, what)
        self.writing_timer: asyncio.TimerHandle | None = None
        self.write_mark = (0, 0)  # (bytes waiting, resumes) when the client last took some
        self.write_still = 0  # looks since then that found it had taken nothing
        self.write_resumes = 0  # times the client took enough for the answer to go on
        self.accepted = False
        self.past_cap = False  # taken past `max_connections`: a probe's, or a 503
        self.deaf = False  # what the client sends is no longer read
        self.owed: tuple[int, str, str] | None = None  # an edge answer that follows earlier ones

    # ----- connections ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        shared = self.shared
        if len(self.connections) - shared.past_cap >= self.limits.max_connections:
            if shared.past_cap >= self.limits.probe_connections:
                log.warning(
                    "connection closed at once: %d connections held already, %d of them past the cap",
                    len(self.connections),
                    shared.past_cap,
                )
                transport.close()
                self.deaf = True
                return
            self.past_cap = True
            shared.past_cap += 1
        self.accepted = True
        self.client_watch = ClientWatch()
        super().connection_made(CoalescingTransport(transport, self.loop, self.watch_writing))  # type: ignore[arg-type]
        shared.held(len(self.connections))
        self.start_timer(self.limits.header_timeout, "a request")

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.accepted:
            return
        if self.past_cap:
            self.past_cap = False
            self.shared.past_cap -= 1
        if self.flow.write_paused:  # it leaves an answer it did not take
            self.shared.release_memory_soon(self.loop)
        self.cancel_timer()
        self.client_watch.lost()
        super().connection_lost(exc)
        self.shared.let_go(len(self.connections), self.loop)
        if self.writing_timer is not None:
            self.writing_timer.cancel()
            self.writing_timer = None
        # the transport's callback was the one way back to this protocol: without it, the
        # connection's objects go when the last reference does, not at the next full collection
        # (after a burst of 8,000 streams, 90,000 objects still waited for one)
        if isinstance(self.transport, CoalescingTransport):
            self.transport.closed_with_data = ignore

    def data_received(self, data: bytes) -> None:
        if self.deaf:
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
            self.refuse_upgrade()
        except httptools.HttpParserError:
            self.answer(400, "The request could not be read as HTTP/1.1.")

    def refuse_upgrade(self) -> None:
        """No protocol upgrade (a WebSocket, h2c) is made here. A request read whole before it
        asked (a GET with `Upgrade: websocket`, as Codex's built-in provider sends on
        /v1/responses) is answered as a plain request, and that answer is the refusal: one answer,
        not 101, and the connection closes after it. Any other is refused with 400."""
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete and self.in_headers:
            cycle.keep_alive = False
            self.deaf = True  # nothing sent after the upgrade request is read
            self.cancel_timer()
            return
        self.answer(400, "Protocol upgrades are not supported here.")

    def send_400_response(self, msg: str) -> None:
        self.answer(400, "The request could not be read as HTTP/1.1.")

    # ----- the edge's own answers ------------------------------------------------------------

    def answer(self, status: int, message: str) -> None:
        """Answer the request being read, in the shape of its path's dialect, and close: now, or
        after the answers still owed to earlier requests (never inside one of them)."""
        self.cancel_timer()
        if self.transport.is_closing():
            return
        path = self.path_so_far()
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            if self.in_headers:  # the request being read came after `cycle`
                self.owe(status, message, path)
                return
            waiting = [entry for entry in self.pipeline if entry[0] is cycle]
            if waiting:  # it waits behind another request's answer: it will never run
                self.pipeline.remove(waiting[0])
                self.owe(status, message, path)
                return
            if cycle.response_started:
                self.transport.close()  # its own answer has begun: nothing in shape can follow
                return
            cycle.disconnected = True  # this is its answer: its handler has no one to answer
            cycle.message_event.set()
        self.send_answer(status, message, path)

    def owe(self, status: int, message: str, path: str) -> None:
        """Answer after the earlier requests' answers, and read nothing more meanwhile."""
        self.owed = (status, message, path)
        self.deaf = True
        self.flow.pause_reading()

    def send_answer(self, status: int, message: str, path: str) -> None:
        if self.transport.is_closing():
            return
        body, media_type = self.render_error(status, message, path)
        head = [
            STATUS_LINE[status],
            b"content-type: " + media_type + b"\r\n",
            b"content-length: " + str(len(body)).encode() + b"\r\n",
            b"connection: close\r\n\r\n",
        ]
        self.transport.write(b"".join(head) + body)
        self.transport.close()

    def on_response_complete(self) -> None:
        last = not self.pipeline
        super().on_response_complete()
        if last:
            if self.owed is not None:
                self.send_answer(*self.owed)
                self.owed = None
        elif self.reading is not None:
            # the gateway reads again (uvicorn stops while a request waits): the client's time
            # to send what is being read starts over
            self.start_timer(self.reading[1], self.reading[2])

    def path_so_far(self) -> str:
        url = getattr(self, "url", b"") or b""
        try:
            return httptools.parse_url(url).path.decode("ascii", "replace") if url else ""
        except httptools.HttpParserInvalidURLError:
            return ""

    # ----- the header block ------------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.scope["extensions"] = {SCOPE_KEY: self.client_watch}  # type: ignore[dict-item]
        self.header_bytes = 0
        self.expectation = None
        self.in_headers = True
        self.start_timer(self.limits.header_timeout, "the request's headers")

    def on_url(self, url: bytes) -> None:
        self.header_bytes += len(url)
        self.check_header_size()
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:  # uvicorn's, with the size counted
        self.header_bytes += len(name) + len(value) + 4
        self.check_header_size()
        name = name.lower()
        if name == b"expect":
            self.expectation = value
        self.headers.append((name, value))

    def check_header_size(self) -> None:
        if self.header_bytes > self.limits.max_header_bytes:
            raise Refused(431, f"The request's headers exceed {self.limits.max_header_bytes} bytes.")

    def on_headers_complete(self) -> None:
        if self.expectation is not None:
            self.check_expectation(self.expectation)
        if self.past_cap:
            self.check_probe()
        elif len(self.pipeline) >= self.limits.max_pipelined:
            raise Refused(
                503,
                f"More than {self.limits.max_pipelined} requests wait on this connection for the "
                "answers before them: read those, or send the rest on another connection.",
            )
        self.in_headers = False
        self.header_bytes_received = 0
        self.start_timer(self.limits.body_timeout, "the request's body")
        super().on_headers_complete()
        if self.past_cap:
            self.cycle.keep_alive = False  # one answer, and the place is free again
        if self.scope["http_version"] == "1.0":
            self.cycle.__class__ = CloseDelimitedCycle
        else:
            self.cycle.__class__ = PieceWritingCycle

    def check_expectation(self, expectation: bytes) -> None:
        """413 before the client is told to send a body the gateway would refuse; 417 for an
        expectation it cannot meet (RFC 9110, 10.1.1)."""
        if expectation.strip().lower() != b"100-continue":
            raise Refused(417, "The only expectation the gateway meets is 100-continue.")
        for name, value in self.headers:
            if name == b"content-length" and value.strip().isdigit() and int(value) > self.max_body_bytes:
                raise Refused(
                    413, f"Request body exceeds the gateway's limit of {self.max_body_bytes} bytes."
                )
        self.expect_100_continue = True

    def check_probe(self) -> None:
        """Past the connection cap only the probes are answered, so that a full worker still
        says it is alive."""
        if self.path_so_far() not in PROBES or self.parser.get_method() != b"GET":
            raise Refused(503, "The gateway holds all the connections it takes; try again shortly.")

    def on_message_complete(self) -> None:
        self.stop_timer()
        self.in_headers = True  # what comes next is the next request's header block
        super().on_message_complete()

    # ----- time limits on reading --------------------------------------------------------------

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
        if self.flow.read_paused:  # the gateway does not read now: not the client's time
            self.start_timer(seconds, what)
            return
        self.reading = None
        self.answer(408, f"The client took longer than {seconds:g} s to send {what}.")

    # ----- the time limit on writing -----------------------------------------------------------

    def pause_writing(self) -> None:
        self.flow.pause_writing()
        self.watch_writing()

    def resume_writing(self) -> None:
        self.flow.resume_writing()
        self.write_resumes += 1

    def watch_writing(self) -> None:
        """The client must take some of what waits for it within `write_timeout`. Looked at
        `WRITE_LOOKS` times a timeout while writing is stalled (or a close waits for the client),
        never per write: a client that takes nothing is cut within 1 + 1/WRITE_LOOKS timeouts."""
        if self.writing_timer is None:
            self.write_mark = (self.waiting_for_client(), self.write_resumes)
            self.write_still = 0
            self.look_at_writing_later()

    def look_at_writing_later(self) -> None:
        period = self.limits.write_timeout / WRITE_LOOKS
        self.writing_timer = self.loop.call_later(period, self.look_at_writing)

    def waiting_for_client(self) -> int:
        """What is written and not yet taken: in the transport, and in the socket."""
        return self.transport.get_write_buffer_size() + unacknowledged(self.transport)

    def look_at_writing(self) -> None:
        self.writing_timer = None
        if not self.transport.get_write_buffer_size():
            return  # the rest is the kernel's: the connection no longer waits for it
        if not (self.flow.write_paused or self.transport.is_closing()):
            return  # little enough that the answer goes on
        mark = (self.waiting_for_client(), self.write_resumes)
        if mark[0] < self.write_mark[0] or mark[1] != self.write_mark[1]:
            self.write_mark, self.write_still = mark, 0  # it took some
        else:
            self.write_still += 1
            if self.write_still >= WRITE_LOOKS:
                log.info(
                    "connection cut: the client took nothing of %d bytes for %g s",
                    mark[0],
                    self.limits.write_timeout,
                )
                self.transport.abort()
                return
        self.look_at_writing_later()
