"""The gateway's one HTTP client for upstreams: aiohttp, with the limits and the one replay the
gateway needs, and its failures as a small tree of our own (callers never see aiohttp's).

Why aiohttp. It replaced a hand-written HTTP/1.1 pool (asyncio + httptools: the cheapest, but a
non-streamed answer over 1 MiB hung, 1xx answers ended the response, no proxy or client
certificate). pyreqwest (Rust reqwest) was measured cheaper than aiohttp here (+41–62 µs of CPU
per request against +81–157) and speaks HTTP/2, but version 0.15 cannot hang up on a request
whose answer has not begun: a cancelled request's task is detached, not aborted, and runs until
the upstream answers — for a non-streamed chat completion, the whole generation, for a client
long gone. aiohttp closes the connection at once, so the upstream stops working too. aiohttp
has no HTTP/2 client; every upstream here speaks HTTP/1.1.

What this module adds to aiohttp:
- limits: the answer's header block (`max_header_bytes`: each line and the whole block) and its
  body (`max_response_bytes`, counted after decompression; a Content-Length beyond it is refused
  before a byte of the body is read);
- one replay, on a fresh connection, of a request whose kept-alive connection the upstream
  closed as it was written (it had not answered a byte: the race every keep-alive pool meets);
- the proxy and TLS settings of `NetworkOptions`, decided once at start;
- no redirects, cookies or environment lookups: what is sent is what the deployment says;
- no second pass of aiohttp's parser for a resume of reading that never paused
  (`UpstreamProtocol`): at a model's pace, one pass a chunk, not two.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import http_exceptions
from aiohttp.client_proto import ResponseHandler
from yarl import URL

from backends.http.resolver import UpstreamResolver
from gateway.core.memory import release_free_memory
from gateway.core.turns import LoopTurns, turns_of

# Once an answer this large is let go of, the heap's free pages go back to the system.
RELEASE_AFTER_BYTES = 4 * 1024 * 1024
# A write to a connection the upstream has just closed fails with one of these.
REPLAYED_ERRNOS = frozenset({errno.ECONNRESET, errno.EPIPE})


class UpstreamError(Exception):
    """Talking to the upstream failed."""


class ConnectFailed(UpstreamError):
    """No connection: refused, unresolvable, TLS or proxy refused, or slower than `connect`."""


class PoolBusy(UpstreamError):
    """Every connection stayed busy for the whole connect timeout."""


class ProtocolError(UpstreamError):
    """Not a well-formed HTTP/1.1 answer, or the connection ended before the answer did."""


class TooLarge(UpstreamError):
    """The answer's header block or body is larger than the limits allow."""


@dataclass(frozen=True, slots=True)
class Limits:
    connect: float  # seconds for a connection: from the pool, or TCP + proxy + TLS
    max_connections: int | None  # None: no cap (the gateway's admission limit bounds it)
    keepalive_seconds: float  # an idle connection's life; 0: closed after each answer
    max_header_bytes: int
    max_response_bytes: int


class UpstreamResponse:
    """An upstream's answer: status and headers, then the body whole or piece by piece.

    `close` must be called when done with it: the connection goes back to the pool when the
    body was read to its end, and is closed otherwise (the upstream sees the request abandoned).
    """

    __slots__ = ("client", "headers", "limit", "received", "response", "status", "turns")

    def __init__(self, response: aiohttp.ClientResponse, limit: int, client: UpstreamClient) -> None:
        self.client: UpstreamClient | None = client
        self.response = response
        self.status = response.status
        self.headers: Mapping[str, str] = response.headers  # case-insensitive
        self.limit = limit
        self.received = 0
        self.turns = client.turns or turns_of(asyncio.get_running_loop())

    @property
    def media_type(self) -> str:
        """The Content-Type without its parameters, lower case ("" when absent)."""
        return self.response.content_type if "content-type" in self.headers else ""

    async def read(self) -> bytes:
        """The whole body (at most `max_response_bytes`)."""
        response = self.response
        length = response.content_length
        try:
            if length is not None and "content-encoding" not in self.headers:
                body = await response.read()  # its length was checked against the limit
                self.received = len(body)
                return body
            pieces: list[bytes] = []
            try:
                while piece := await self.read_some():
                    pieces.append(piece)
            except BaseException:
                # the exception's traceback holds this frame until the garbage collector runs:
                # let go of what was read (up to max_response_bytes) now
                pieces.clear()
                raise
            return b"".join(pieces)
        except aiohttp.ClientError as error:
            raise answer_error(error) from None

    async def read_some(self) -> bytes:
        """What has arrived of the body (waiting for some); b"" once it has all been read. A read
        that waited says so to the loop's turn count: the loop has turned since (a relay at a
        model's pace then needs no callback to learn it, gateway/core/turns.py)."""
        content = self.response.content
        unread = content.total_bytes != self.received  # else the read waits for more, if any
        try:
            piece = await content.readany()
        except aiohttp.ClientError as error:
            raise answer_error(error) from None
        if piece and not unread:
            self.turns.waited()
        self.received += len(piece)
        if self.received > self.limit:
            raise TooLarge(f"the answer is larger than {self.limit} bytes")
        return piece

    def close(self) -> None:
        if self.client is None:
            return
        self.client.in_flight -= 1
        self.client = None
        if self.response.content.is_eof():
            self.response.release()  # read to its end: the connection is kept
        else:
            self.response.close()  # unread: the connection is closed
        if self.received >= RELEASE_AFTER_BYTES:
            release_free_memory()


class UpstreamProtocol(ResponseHandler):
    """aiohttp's client protocol, but for a resume of reading that was never paused.

    aiohttp's body reader asks the protocol to resume reading after every read that leaves its
    buffer under the low-water mark, paused or not, and the protocol then feeds its parser an
    empty piece (`data_received(b"")`) to go on with whatever a pause left unparsed: at a
    model's pace, a second pass through the protocol and the parser for every chunk. Only a
    pause (`pause_reading`, which sets `_reading_paused`) leaves anything unparsed, so a resume
    without one has nothing to do. (aiohttp 3.12's reader asked only after a pause, and the
    method took no argument: whatever it is given is passed on as given.)
    """

    def resume_reading(self, *args: Any, **kwargs: Any) -> None:
        if self._reading_paused:
            super().resume_reading(*args, **kwargs)


class UpstreamConnector(aiohttp.TCPConnector):
    """aiohttp's connector, its connections spoken by `UpstreamProtocol`."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._factory = functools.partial(UpstreamProtocol, loop=self._loop)  # type: ignore[assignment]


class UpstreamClient:
    """Keep-alive connections to one upstream origin; created and used in one event loop."""

    def __init__(
        self,
        base_url: str,
        headers: Mapping[str, str],
        limits: Limits,
        *,
        proxy: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        """`headers` go with every request; `ssl_context` for https (None: the system's CAs)."""
        self.base_url = URL(base_url)
        self.headers = dict(headers)
        self.limits = limits
        self.proxy = URL(proxy) if proxy else None
        self.ssl: ssl.SSLContext | bool = ssl_context if ssl_context is not None else True
        self.urls: dict[str, URL] = {}
        self.in_flight = 0  # requests holding a connection, or waiting for one
        self._session: aiohttp.ClientSession | None = None
        self._fresh: aiohttp.ClientSession | None = None  # one connection per request: replays
        self.turns: LoopTurns | None = None  # its loop's, once it has a session

    # ----- sessions ---------------------------------------------------------------------------

    def session(self, fresh: bool = False) -> aiohttp.ClientSession:
        if fresh:
            if self._fresh is None:
                self._fresh = self.new_session(fresh=True)
            return self._fresh
        if self._session is None:
            self._session = self.new_session(fresh=False)
        return self._session

    def new_session(self, fresh: bool) -> aiohttp.ClientSession:
        self.turns = turns_of(asyncio.get_running_loop())
        limits = self.limits
        keep = limits.keepalive_seconds > 0 and not fresh
        connector = UpstreamConnector(
            limit=limits.max_connections or 0,  # aiohttp: 0 is no cap
            limit_per_host=0,
            force_close=not keep,
            keepalive_timeout=limits.keepalive_seconds if keep else None,
            ssl=self.ssl,
            resolver=UpstreamResolver(),
        )
        return aiohttp.ClientSession(
            connector=connector,
            headers=self.headers,
            skip_auto_headers=("accept", "accept-encoding", "user-agent", "content-type"),
            timeout=aiohttp.ClientTimeout(total=None, connect=limits.connect, sock_connect=limits.connect),
            cookie_jar=aiohttp.DummyCookieJar(),
            auto_decompress=True,
            max_line_size=limits.max_header_bytes,
            max_field_size=limits.max_header_bytes,
            trust_env=False,
        )

    async def aclose(self) -> None:
        for session in (self._session, self._fresh):
            if session is not None:
                await session.close()
        self._session = self._fresh = None

    # ----- requests ---------------------------------------------------------------------------

    def url(self, path: str) -> URL:
        url = self.urls.get(path)
        if url is None:
            url = self.urls[path] = URL(str(self.base_url).rstrip("/") + path, encoded=True)
        return url

    async def post(
        self, path: str, body: bytes, headers: Mapping[str, str] | None = None
    ) -> UpstreamResponse:
        """Send the request and wait for the answer's status and headers."""
        url = self.url(path)
        self.in_flight += 1
        try:
            try:
                response = await self.send(self.session(), url, body, headers)
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as error:
                if not closed_as_written(error):
                    raise
                # the upstream closed a kept-alive connection as the request went out on it:
                # it answered nothing, so the request goes again, once, on a new connection
                response = await self.send(self.session(fresh=True), url, body, headers)
        except BaseException as error:
            cap = self.limits.max_connections
            busy = cap is not None and self.in_flight > cap
            self.in_flight -= 1
            if isinstance(error, aiohttp.ConnectionTimeoutError):
                if busy:
                    raise PoolBusy("every connection to the upstream stayed busy") from None
                raise ConnectFailed(f"no connection within {self.limits.connect:g} s") from None
            if isinstance(error, aiohttp.ClientError):
                raise request_error(error) from None
            raise
        return self.checked(response)

    async def send(
        self, session: aiohttp.ClientSession, url: URL, body: bytes, headers: Mapping[str, str] | None
    ) -> aiohttp.ClientResponse:
        return await session.post(url, data=body, headers=headers, proxy=self.proxy, allow_redirects=False)

    def checked(self, response: aiohttp.ClientResponse) -> UpstreamResponse:
        """The answer, if its header block and announced length are within the limits."""
        limits = self.limits
        size = 0
        for name, value in response.raw_headers:
            size += len(name) + len(value) + 4  # ": " and CRLF
        if size > limits.max_header_bytes:
            discard(response)
            self.in_flight -= 1
            raise TooLarge(f"the answer's header block is larger than {limits.max_header_bytes} bytes")
        length = response.content_length
        if length is not None and length > limits.max_response_bytes:
            discard(response)
            self.in_flight -= 1
            raise TooLarge(f"the answer is larger than {limits.max_response_bytes} bytes ({length})")
        return UpstreamResponse(response, limits.max_response_bytes, self)


def discard(response: aiohttp.ClientResponse) -> None:
    """Refuse an answer and close its connection: never reused after an answer the gateway refused.

    aiohttp gives the connection of an answer that arrived whole back to its pool at once, before
    the caller sees the answer (it does so in the same step of this task, so no other request can
    have taken it yet): that connection is closed through its protocol.
    """
    protocol = getattr(response, "_protocol", None)
    response.close()
    if protocol is not None:
        protocol.close()


def closed_as_written(error: Exception) -> bool:
    """The upstream hung up before answering a byte (not a refused or failed connect): the write
    failed at the socket, or was never made because the connection was closing already.

    The second is llama-server's way after every stream: it closes the connection once the
    stream has ended, without a `Connection: close`, so the next request may take that
    connection from the pool before its close is read. aiohttp then refuses to write on it
    (`ClientConnectionResetError`, with no errno) and says "Can not write request body"."""
    if isinstance(error, aiohttp.ServerDisconnectedError):
        return True
    return (
        isinstance(error, aiohttp.ClientOSError)
        and not isinstance(error, aiohttp.ClientConnectorError)
        and (
            error.errno in REPLAYED_ERRNOS or isinstance(error.__cause__, aiohttp.ClientConnectionResetError)
        )
    )


def request_error(error: aiohttp.ClientError) -> UpstreamError:
    """A failure before the answer's headers were read."""
    if isinstance(error, aiohttp.ClientHttpProxyError):
        return ConnectFailed(f"the proxy refused the connection ({error.status} {error.message})")
    if isinstance(error, aiohttp.ClientConnectorError):  # refused, DNS, TLS, proxy unreachable
        # a certificate's error is its own attribute (aiohttp 3.12's has no `os_error`)
        cause = (
            error.certificate_error
            if isinstance(error, aiohttp.ClientConnectorCertificateError)
            else error.os_error
        )
        return ConnectFailed(f"{type(cause).__name__}: {cause}")
    if isinstance(error, aiohttp.ServerDisconnectedError):
        return ProtocolError("the upstream closed the connection before answering")
    return answer_error(error)


def answer_error(error: aiohttp.ClientError) -> UpstreamError:
    """A failure reading the answer: malformed, too large, or cut short."""
    chain: list[BaseException] = []
    cause: BaseException | None = error
    while cause is not None and len(chain) < 8:
        chain.append(cause)
        cause = cause.__cause__
    said = [str(getattr(link, "message", "") or link) for link in chain]
    if any(isinstance(link, http_exceptions.LineTooLong) for link in chain) or any(
        "Got more than" in text or "Too many headers" in text for text in said
    ):
        return TooLarge("the answer's header block is too large")
    if isinstance(error, aiohttp.ClientResponseError | aiohttp.ClientPayloadError):
        first = next((text.strip().splitlines()[0] for text in said if text.strip()), "")
        return ProtocolError(f"malformed or cut short: {first.rstrip(':') or type(error).__name__}")
    if isinstance(error, aiohttp.ClientConnectionError):
        return ProtocolError("the upstream closed the connection mid-answer")
    return ProtocolError(f"{type(error).__name__}: {error}")
