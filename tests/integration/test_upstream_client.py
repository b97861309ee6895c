"""backends.http.client and backends.http.options against raw servers on loopback that each
test scripts: keep-alive, limits, the replay, cancellation, TLS with a private CA and a client
certificate, and proxies (forwarding and CONNECT), with no gateway in between."""

from __future__ import annotations

import asyncio
import errno
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import trustme

from backends.http.client import (
    ConnectFailed,
    Limits,
    PoolBusy,
    ProtocolError,
    TooLarge,
    UpstreamClient,
    UpstreamProtocol,
    closed_as_written,
)
from backends.http.options import NetworkOptions, environment_proxy
from gateway.core.turns import turns_of
from tests.support.loopback_server import LoopbackServer
from tests.support.servers import free_port

Script = Callable[[bytes, asyncio.StreamWriter], Awaitable[bool]]  # False: hang up after it
LIMITS = Limits(connect=2.0, max_connections=4, keepalive_seconds=30.0, max_header_bytes=8192,
                max_response_bytes=1 << 20)  # fmt: skip


class ScriptedServer(LoopbackServer):
    """Reads each request (head and content-length body) and lets `script` write the answer."""

    thread_name = "scripted-http"

    def __init__(self, script: Script, tls: ssl.SSLContext | None = None) -> None:
        super().__init__()
        self.script = script
        self.ssl_context = tls
        self.connections = 0
        self.requests: list[bytes] = []
        self.hung_up = 0  # connections the client closed

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                request = head + await reader.readexactly(length)
                self.requests.append(request)
                if not await self.script(request, writer):
                    writer.close()
                    return
        except (asyncio.IncompleteReadError, ConnectionError):  # reading or writing: it hung up
            self.hung_up += 1
        finally:
            self.tasks.discard(task)


def fixed(status: int, body: bytes, *headers: str) -> Script:
    async def script(request: bytes, writer: asyncio.StreamWriter) -> bool:
        lines = [f"HTTP/1.1 {status} X", f"content-length: {len(body)}", *headers]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        await writer.drain()
        return True

    return script


def two_chunks(release: asyncio.Event) -> Script:
    """A chunked stream: `first` at once, `second` and the end once `release` is set."""

    async def script(request: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
                     b"transfer-encoding: chunked\r\n\r\n6\r\nfirst\n\r\n")  # fmt: skip
        await writer.drain()
        await release.wait()
        writer.write(b"7\r\nsecond\n\r\n0\r\n\r\n")
        await writer.drain()
        return True

    return script


def client_for(url: str, proxy: str | None = None, ssl_context: Any = None, **limits: Any) -> UpstreamClient:
    """A client of `url`/v1 with LIMITS, changed as `limits` say."""
    headers = {"authorization": "Bearer k", "x-team": "a"}
    return UpstreamClient(
        url + "/v1", headers, replace(LIMITS, **limits), proxy=proxy, ssl_context=ssl_context
    )


def run(coroutine: Awaitable[Any]) -> Any:
    return asyncio.run(asyncio.wait_for(coroutine, 20))


async def whole(client: UpstreamClient, path: str = "/chat/completions") -> tuple[int, bytes]:
    answer = await client.post(path, b'{"a": 1}')
    try:
        return answer.status, await answer.read()
    finally:
        answer.close()


def wait_for(condition: Callable[[], bool], seconds: float = 5.0) -> bool:
    async def poll() -> bool:
        for _ in range(int(seconds / 0.01)):
            if condition():
                return True
            await asyncio.sleep(0.01)
        return condition()

    return asyncio.run(poll())


# ----- HTTP/1.1 ---------------------------------------------------------------------------------


def test_answers_are_read_whole_over_one_kept_alive_connection():
    with ScriptedServer(fixed(200, b'{"ok": true}', "content-type: application/json")) as server:

        async def go() -> list[tuple[int, bytes]]:
            client = client_for(server.url)
            seen = [await whole(client) for _ in range(5)]
            await client.aclose()
            return seen

        assert run(go()) == [(200, b'{"ok": true}')] * 5
    assert server.connections == 1
    head = server.requests[0].decode()
    assert head.startswith("POST /v1/chat/completions HTTP/1.1\r\n")
    lowered = head.lower()
    for line in ("authorization: bearer k", "x-team: a", "content-length: 8"):
        assert line in lowered
    assert "cookie" not in lowered and head.endswith('\r\n\r\n{"a": 1}')


def test_a_chunked_answer_arrives_piece_by_piece(monkeypatch: pytest.MonkeyPatch):
    """Each chunk read as it comes, and parsed once: aiohttp resumes reading after each read,
    paused or not, and the connection's protocol (UpstreamProtocol) feeds its parser again only
    after a pause."""
    fed: list[bytes] = []
    received = UpstreamProtocol.data_received

    def counted(protocol: UpstreamProtocol, data: bytes) -> None:
        fed.append(data)
        received(protocol, data)

    monkeypatch.setattr(UpstreamProtocol, "data_received", counted)
    release = asyncio.Event()
    with ScriptedServer(two_chunks(release)) as server:

        async def go() -> tuple[str, bytes, bytes, bytes]:
            client = client_for(server.url)
            answer = await client.post("/chat/completions", b"{}")
            first = await answer.read_some()
            server.loop.call_soon_threadsafe(release.set)
            second, end = await answer.read_some(), await answer.read_some()
            answer.close()
            await client.aclose()
            return answer.media_type, first, second, end

        assert run(go()) == ("text/event-stream", b"first\n", b"second\n", b"")
    assert fed and b"" not in fed


def test_a_body_that_ends_with_the_connection_is_read_and_the_connection_not_kept():
    async def script(request: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nall of it")
        await writer.drain()
        return False

    with ScriptedServer(script) as server:

        async def go() -> list[tuple[int, bytes]]:
            client = client_for(server.url)
            seen = [await whole(client) for _ in range(2)]
            await client.aclose()
            return seen

        assert run(go()) == [(200, b"all of it")] * 2
    assert server.connections == 2


def test_a_large_answer_is_read_whole():
    payload = bytes(range(256)) * (4 * 4096)  # 4 MiB: the old pool hung on anything over 1 MiB

    with ScriptedServer(fixed(200, payload)) as server:

        async def go() -> tuple[int, bytes]:
            client = client_for(server.url, max_response_bytes=8 << 20)
            try:
                return await whole(client)
            finally:
                await client.aclose()

        assert run(go()) == (200, payload)


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_an_answer_over_the_limit_is_refused_and_its_connection_closed(framing: str):
    body = b"x" * (2 << 20)

    async def script(request: bytes, writer: asyncio.StreamWriter) -> bool:
        if framing == "chunked":
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
            for start in range(0, len(body), 65536):
                writer.write(b"10000\r\n" + body[start : start + 65536] + b"\r\n")
            writer.write(b"0\r\n\r\n")
        else:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(body) + body)
        await writer.drain()
        return True

    with ScriptedServer(script) as server:

        async def go() -> None:
            client = client_for(server.url)
            try:
                with pytest.raises(TooLarge, match="larger than 1048576 bytes"):
                    await whole(client)
            finally:
                await client.aclose()

        run(go())
        assert wait_for(lambda: server.hung_up == 1)


@pytest.mark.parametrize(
    ("headers", "why"),
    [
        (b"x-big: " + b"a" * 10_000 + b"\r\n", "one line over the limit"),
        (b"".join(b"x-h%d: %s\r\n" % (i, b"v" * 100) for i in range(100)), "short lines, the block over it"),
        (b"".join(b"x-h%d: v\r\n" % i for i in range(1000)), "more headers than aiohttp reads"),
    ],
)
def test_a_header_block_over_the_limit_is_refused(headers: bytes, why: str):
    async def script(request: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\n" + headers + b"content-length: 2\r\n\r\n{}")
        await writer.drain()
        return True

    with ScriptedServer(script) as server:

        async def go() -> None:
            client = client_for(server.url)
            try:
                with pytest.raises(TooLarge, match="header block"):
                    await whole(client)
            finally:
                await client.aclose()

        run(go())
        assert wait_for(lambda: server.hung_up == 1), "the connection was kept after a refused answer"


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly part", "cut short"),
        (b"this is not http\r\n\r\n", "malformed"),
        (b"HTTP/1.1 2x0 OK\r\ncontent-length: 2\r\n\r\n{}", "malformed"),
        (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n10000000000000000\r\nabc", "malformed"),
    ],
    ids=["closed-mid-body", "not-http", "bad-status", "chunk-size-2^64"],
)
def test_a_broken_answer_is_a_protocol_error(answer: bytes, said: str):
    async def script(request: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(answer)
        await writer.drain()
        return False

    with ScriptedServer(script) as server:

        async def go() -> None:
            client = client_for(server.url)
            try:
                with pytest.raises(ProtocolError, match=said):
                    await whole(client)
            finally:
                await client.aclose()

        run(go())


@pytest.mark.parametrize("interim", [b"100 Continue", b"103 Early Hints\r\nlink: </a.css>; rel=preload"])
def test_interim_answers_are_skipped(interim: bytes):
    async def script(request: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 " + interim + b"\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
        await writer.drain()
        return True

    with ScriptedServer(script) as server:

        async def go() -> list[tuple[int, bytes]]:
            client = client_for(server.url)
            try:
                return [await whole(client) for _ in range(2)]
            finally:
                await client.aclose()

        assert run(go()) == [(200, b"{}")] * 2


def test_only_a_read_that_waited_counts_a_turn_of_the_loop():
    """A read that found nothing yet and came back with bytes says the loop has turned
    (gateway/core/turns.py: a relay at a model's pace asks for no callback to learn it); a read of
    bytes that had arrived already, and the body's end, say nothing."""
    release = asyncio.Event()
    with ScriptedServer(two_chunks(release)) as server:

        async def go() -> tuple[list[bytes], list[int]]:
            client = client_for(server.url)
            answer = await client.post("/chat/completions", b"{}")
            turns = turns_of(asyncio.get_running_loop())
            await asyncio.sleep(0.1)  # the first chunk has arrived
            pieces, moved = [], []
            for waits in (False, True, False):
                before = turns.count
                reading = asyncio.ensure_future(answer.read_some())
                if waits:
                    await asyncio.sleep(0.1)
                    assert not reading.done()  # nothing has come yet
                    server.loop.call_soon_threadsafe(release.set)
                pieces.append(await reading)
                moved.append(turns.count - before)
            assert not turns.pending  # no callback was asked for: the count moved by itself
            answer.close()
            await client.aclose()
            return pieces, moved

        assert run(go()) == ([b"first\n", b"second\n", b""], [0, 1, 0])


def test_a_gzip_answer_is_decoded():
    import gzip

    async def script(request: bytes, writer: asyncio.StreamWriter) -> bool:
        body = gzip.compress(b'{"ok": 1}')
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-encoding: gzip\r\ncontent-length: %d\r\n\r\n" % len(body) + body
        )
        await writer.drain()
        return True

    with ScriptedServer(script) as server:

        async def go() -> tuple[int, bytes]:
            client = client_for(server.url)
            try:
                return await whole(client)
            finally:
                await client.aclose()

        assert run(go()) == (200, b'{"ok": 1}')
    assert b"accept-encoding" not in server.requests[0].lower()  # the backend asks for identity itself


def chunked_stream(pieces: list[bytes], compressed: bool = False) -> Script:
    """A chunked answer of `pieces`, gzip-compressed as one stream when `compressed`."""
    import zlib

    async def script(request: bytes, writer: asyncio.StreamWriter) -> bool:
        encoding = b"content-encoding: gzip\r\n" if compressed else b""
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n" + encoding
                     + b"transfer-encoding: chunked\r\n\r\n")  # fmt: skip
        packer = zlib.compressobj(wbits=31)
        for piece in pieces:
            if compressed:
                piece = packer.compress(piece) + packer.flush(zlib.Z_SYNC_FLUSH)
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
        if compressed:
            tail = packer.flush()
            writer.write(b"%x\r\n%s\r\n" % (len(tail), tail))
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True

    return script


@pytest.mark.parametrize("compressed", [False, True], ids=["plain", "gzip"])
def test_a_stream_read_slower_than_it_arrives_pauses_and_is_read_whole(
    compressed: bool, monkeypatch: pytest.MonkeyPatch
):
    """Far more than aiohttp's buffer holds, read a little at a time: the connection's reading
    pauses and resumes (a resume that never paused is skipped, UpstreamProtocol), and every byte
    arrives in order, compressed or not."""
    pieces = [b"data: %06d %s\n\n" % (n, bytes([65 + n % 26]) * 500) for n in range(4000)]
    paused: list[int] = []
    pause = UpstreamProtocol.pause_reading

    def counted_pause(protocol: UpstreamProtocol) -> None:
        paused.append(1)
        pause(protocol)

    monkeypatch.setattr(UpstreamProtocol, "pause_reading", counted_pause)
    with ScriptedServer(chunked_stream(pieces, compressed)) as server:

        async def go() -> bytes:
            client = client_for(server.url, max_response_bytes=8 << 20)
            answer = await client.post("/chat/completions", b"{}")
            await asyncio.sleep(0.2)  # the server has written it all: the client's buffer is full
            read = []
            while piece := await answer.read_some():
                read.append(piece)
                await asyncio.sleep(0)
            answer.close()
            await client.aclose()
            return b"".join(read)

        assert run(go()) == b"".join(pieces)
    assert paused  # the test took the pause's path


# ----- connections ------------------------------------------------------------------------------


def test_a_refused_connection_is_connect_failed():
    async def go() -> None:
        client = client_for(f"http://127.0.0.1:{free_port()}")
        try:
            await whole(client)
        finally:
            await client.aclose()

    with pytest.raises(ConnectFailed):
        run(go())


def test_a_full_pool_waits_for_a_connection_then_says_busy():
    release = asyncio.Event()

    async def script(request: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\n{}\r\n")
        await writer.drain()
        if not release.is_set():
            await release.wait()  # the first answer holds its connection until told
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True

    with ScriptedServer(script) as server:

        async def go() -> tuple[int, bytes]:
            client = client_for(server.url, max_connections=1, connect=0.3)
            held = await client.post("/x", b"{}")
            with pytest.raises(PoolBusy):
                await client.post("/x", b"{}")
            waiting = asyncio.ensure_future(whole(client, "/x"))  # gets it once the first is done
            await asyncio.sleep(0.05)
            server.loop.call_soon_threadsafe(release.set)
            await held.read()
            held.close()
            result = await waiting
            await client.aclose()
            return result

        assert run(go()) == (200, b"{}")
    assert server.connections == 1


def test_a_connection_closed_as_the_request_was_written_is_replayed_once_on_a_new_one():
    answered: list[int] = []

    async def script(request: bytes, writer: asyncio.StreamWriter) -> bool:
        if answered and answered[-1] == id(writer):  # the second request on this connection
            writer.transport.abort()
            return False
        answered.append(id(writer))
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()
        return True

    with ScriptedServer(script) as server:

        async def go() -> list[tuple[int, bytes]]:
            client = client_for(server.url)
            try:
                return [await whole(client) for _ in range(2)]
            finally:
                await client.aclose()

        assert run(go()) == [(200, b"ok")] * 2
    assert server.connections == 2 and len(server.requests) == 3  # the dropped one, then its replay


def refused_write(cause: BaseException | None) -> aiohttp.ClientOSError:
    """The error aiohttp's request gives when writing its body failed (client_reqrep's send)."""
    error = aiohttp.ClientOSError(getattr(cause, "errno", None), "Can not write request body for http://u/x")
    error.__cause__ = cause
    return error


def test_a_request_never_written_on_a_closing_connection_is_replayed():
    """llama-server closes the connection after a stream without saying so; a request that takes
    it from the pool first is refused by aiohttp before a byte goes out (no errno): replayed.
    The real server's case is tests/system/test_fleet_servers.py's."""
    closing = aiohttp.ClientConnectionResetError("Cannot write to closing transport")
    assert closed_as_written(refused_write(closing))
    assert closed_as_written(refused_write(ConnectionResetError(errno.ECONNRESET, "reset")))
    assert closed_as_written(refused_write(BrokenPipeError(errno.EPIPE, "broken pipe")))
    # a write that failed another way may have gone out in part, or the upstream may be down
    assert not closed_as_written(refused_write(OSError(errno.ETIMEDOUT, "timed out")))
    assert not closed_as_written(refused_write(None))


def test_a_connection_the_upstream_closed_while_idle_is_not_reused():
    async def script(request: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()
        await asyncio.sleep(0.05)
        return False  # keep-alive was promised, but the server hangs up when idle

    with ScriptedServer(script) as server:

        async def go() -> list[tuple[int, bytes]]:
            client = client_for(server.url)
            seen = []
            for _ in range(3):
                seen.append(await whole(client))
                await asyncio.sleep(0.2)
            await client.aclose()
            return seen

        assert run(go()) == [(200, b"ok")] * 3
    assert server.connections == 3


class SilentServer(LoopbackServer):
    """Takes a request, answers it in part or not at all, and notes when the client hangs up."""

    thread_name = "silent-http"

    def __init__(self, begin_answer: bool) -> None:
        super().__init__()
        self.begin_answer = begin_answer
        self.hung_up = asyncio.Event()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        try:
            await reader.readuntil(b"\r\n\r\n")
            await reader.readexactly(2)
            if self.begin_answer:
                writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n")
                await writer.drain()
            await reader.read()  # a generation that takes its time, until the client hangs up
            self.hung_up.set()
        finally:
            writer.close()
            self.tasks.discard(task)


@pytest.mark.parametrize("begin_answer", [False, True], ids=["before-the-answer", "mid-answer"])
def test_a_cancelled_request_hangs_up_on_the_upstream_at_once(begin_answer: bool):
    """What pyreqwest 0.15 could not do before an answer began (its task runs on, detached)."""
    with SilentServer(begin_answer) as server:

        async def go() -> None:
            client = client_for(server.url)

            async def ask() -> None:
                answer = await client.post("/x", b"{}")
                try:
                    while await answer.read_some():
                        pass
                finally:
                    answer.close()

            task = asyncio.ensure_future(ask())
            await asyncio.sleep(0.2)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await client.aclose()

        run(go())
        assert asyncio.run_coroutine_threadsafe(server.hung_up.wait(), server.loop).result(1) is True


# ----- TLS and proxies --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def authority() -> trustme.CA:
    return trustme.CA()


def tls_server_context(authority: trustme.CA, require_client_certificate: bool) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("127.0.0.1").configure_cert(context)
    if require_client_certificate:
        context.verify_mode = ssl.CERT_REQUIRED
        authority.configure_trust(context)
    return context


def write_pem(path: Path, *blobs: trustme.Blob) -> Path:
    path.write_bytes(b"".join(blob.bytes() for blob in blobs))
    return path


def tls_client(url: str, **options: Any) -> UpstreamClient:
    network = NetworkOptions(**options)
    return client_for(url, ssl_context=network.ssl_context())


def test_https_with_a_private_ca(authority: trustme.CA, tmp_path: Path):
    ca_file = write_pem(tmp_path / "ca.pem", authority.cert_pem)
    with ScriptedServer(fixed(200, b"secret"), tls_server_context(authority, False)) as server:

        async def go() -> tuple[int, bytes]:
            trusting = tls_client(server.url, ca_file=ca_file)
            result = await whole(trusting)
            await trusting.aclose()
            # with the system's CAs only, the same server is refused
            untrusting = tls_client(server.url)
            with pytest.raises(ConnectFailed, match="CERTIFICATE_VERIFY_FAILED"):
                await whole(untrusting)
            await untrusting.aclose()
            # … unless nothing is checked at all
            careless = tls_client(server.url, verify=False)
            assert await whole(careless) == (200, b"secret")
            await careless.aclose()
            return result

        assert run(go()) == (200, b"secret")


def test_a_client_certificate_for_an_upstream_that_asks_for_one(authority: trustme.CA, tmp_path: Path):
    ca_file = write_pem(tmp_path / "ca.pem", authority.cert_pem)
    issued = authority.issue_cert("chatgate-client")
    cert = write_pem(tmp_path / "client.pem", *issued.cert_chain_pems)
    key = write_pem(tmp_path / "client.key", issued.private_key_pem)
    both = write_pem(tmp_path / "client-and-key.pem", issued.private_key_pem, *issued.cert_chain_pems)
    with ScriptedServer(fixed(200, b"mutual"), tls_server_context(authority, True)) as server:

        async def go() -> list[tuple[int, bytes]]:
            seen = []
            for options in ({"client_cert": cert, "client_key": key}, {"client_cert": both}):
                client = tls_client(server.url, ca_file=ca_file, **options)
                seen.append(await whole(client))
                await client.aclose()
            anonymous = tls_client(server.url, ca_file=ca_file)
            with pytest.raises((ConnectFailed, ProtocolError)):
                await whole(anonymous)
            await anonymous.aclose()
            return seen

        assert run(go()) == [(200, b"mutual")] * 2


class Proxy(LoopbackServer):
    """An HTTP proxy: CONNECT tunnels, and absolute-form requests forwarded as origin-form."""

    thread_name = "proxy"

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, str, str | None]] = []  # (method, target, Proxy-Authorization)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            line, *fields = head.decode("latin-1").split("\r\n")
            method, target, version = line.split(" ")
            authorization = next(
                (f.split(":", 1)[1].strip() for f in fields if f.lower().startswith("proxy-authorization:")),
                None,
            )
            self.seen.append((method, target, authorization))
            if method == "CONNECT":
                host, port = target.rsplit(":", 1)
                upstream_reader, upstream_writer = await asyncio.open_connection(host, int(port))
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:  # absolute form: http://host:port/path
                rest = target.removeprefix("http://")
                address, _, path = rest.partition("/")
                host, port = address.rsplit(":", 1)
                upstream_reader, upstream_writer = await asyncio.open_connection(host, int(port))
                kept = [f for f in fields if f and not f.lower().startswith("proxy-")]
                forwarded = "\r\n".join([f"{method} /{path} {version}", *kept]) + "\r\n\r\n"
                upstream_writer.write(forwarded.encode("latin-1"))
            await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            self.tasks.discard(task)


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    finally:
        writer.close()


def test_an_http_upstream_through_a_proxy_with_credentials():
    with ScriptedServer(fixed(200, b"proxied")) as server, Proxy() as proxy:
        proxy_url = proxy.url.replace("http://", "http://team:s3cret@")

        async def go() -> tuple[int, bytes]:
            client = client_for(server.url, proxy=proxy_url)
            try:
                return await whole(client)
            finally:
                await client.aclose()

        assert run(go()) == (200, b"proxied")
    [(method, target, authorization)] = proxy.seen
    assert (method, target) == ("POST", f"{server.url}/v1/chat/completions")
    assert authorization == "Basic dGVhbTpzM2NyZXQ="  # team:s3cret


def test_an_https_upstream_through_a_connect_proxy(authority: trustme.CA, tmp_path: Path):
    ca_file = write_pem(tmp_path / "ca.pem", authority.cert_pem)
    tls = tls_server_context(authority, False)
    with ScriptedServer(fixed(200, b"tunnelled"), tls) as server, Proxy() as proxy:

        async def go() -> tuple[int, bytes]:
            network = NetworkOptions(ca_file=ca_file, proxy=proxy.url)
            proxy_url = network.proxy_for(server.url, {})
            client = client_for(server.url, proxy=proxy_url, ssl_context=network.ssl_context())
            try:
                return await whole(client)
            finally:
                await client.aclose()

        assert run(go()) == (200, b"tunnelled")
    assert [(m, t) for m, t, _ in proxy.seen] == [("CONNECT", server.url.removeprefix("https://"))]


# ----- options ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "environment", "expected"),
    [
        ("https://api.example.com/v1", {"HTTPS_PROXY": "http://p:3128"}, "http://p:3128"),
        (
            "https://api.example.com/v1",
            {"https_proxy": "http://low:1", "HTTPS_PROXY": "http://up:1"},
            "http://low:1",
        ),
        ("http://10.0.0.1:8000/v1", {"HTTPS_PROXY": "http://p:3128"}, None),
        ("http://10.0.0.1:8000/v1", {"ALL_PROXY": "http://all:1"}, "http://all:1"),
        ("https://api.example.com/v1", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "example.com"}, None),
        ("https://example.com/v1", {"HTTPS_PROXY": "http://p:1", "no_proxy": ".example.com"}, None),
        ("https://badexample.com/v1", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "example.com"}, "http://p:1"),
        ("http://10.0.0.1:8000/v1", {"HTTP_PROXY": "http://p:1", "NO_PROXY": "10.0.0.1:8000"}, None),
        ("http://10.0.0.1:9000/v1", {"HTTP_PROXY": "http://p:1", "NO_PROXY": "10.0.0.1:8000"}, "http://p:1"),
        ("http://vllm:8000/v1", {"HTTP_PROXY": "http://p:1", "NO_PROXY": "*"}, None),
    ],
)
def test_the_proxy_the_environment_names(url: str, environment: dict[str, str], expected: str | None):
    assert environment_proxy(url, environment) == expected
    assert NetworkOptions().proxy_for(url, environment) == expected  # `proxy: env`, the default
    assert NetworkOptions(proxy="none").proxy_for(url, environment) is None
    assert NetworkOptions(proxy="http://mine:8080").proxy_for(url, environment) == "http://mine:8080"


def test_network_options_are_checked_at_start(tmp_path: Path):
    with pytest.raises(ValueError, match="proxy"):
        NetworkOptions(proxy="socks5://p:1080")
    with pytest.raises(ValueError, match="client_key needs client_cert"):
        NetworkOptions(client_key=write_pem(tmp_path / "k.pem", trustme.CA().cert_pem))
    with pytest.raises(ValueError, match=r"missing\.pem: No such file"):  # read at start, named
        NetworkOptions(ca_file=tmp_path / "missing.pem").ssl_context()
    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate")
    with pytest.raises(ValueError, match=r"bad\.pem"):
        NetworkOptions(ca_file=bad).ssl_context()


def test_every_http_backend_takes_the_same_network_options(authority: trustme.CA, tmp_path: Path):
    from backends.openai_compatible import OpenAICompatibleBackend
    from backends.tgi.backend import TGIBackend
    from gateway.config.source import load_settings
    from gateway.fleet.router import Router

    ca_file = write_pem(tmp_path / "ca.pem", authority.cert_pem)
    environ = {"HTTPS_PROXY": "http://corp-proxy:3128", "NO_PROXY": "internal.example"}
    config = tmp_path / "config.yaml"
    config.write_text(
        "deployments:\n"
        "  - {name: out, backend: openai-compatible, options: {base_url: 'https://api.example.com/v1'}}\n"
        "  - {name: in, backend: tgi, options: {url: 'https://tgi.internal.example'}}\n"
    )
    settings = load_settings(config, environ)  # the environment, read once with the settings
    router = Router(settings.deployments, None, settings.environment.proxies)
    assert router.deployments["out"].replicas[0].backend.proxy == "http://corp-proxy:3128"  # type: ignore[attr-defined]
    assert router.deployments["in"].replicas[0].backend.proxy is None  # type: ignore[attr-defined]
    backends = [
        OpenAICompatibleBackend(
            model="m", base_url="https://api.example.com/v1", ca_file=str(ca_file), proxy_environment=environ
        ),
        TGIBackend(url="https://api.example.com", ca_file=str(ca_file), connect=2, proxy_environment=environ),
    ]
    for backend in backends:
        assert backend.proxy == "http://corp-proxy:3128"  # `proxy: env`, decided once at start
        assert backend.tls is not None and len(backend.tls.get_ca_certs()) == 1  # the private CA only
    inside = OpenAICompatibleBackend(
        model="m", base_url="https://vllm.internal.example/v1", proxy_environment=environ
    )
    assert inside.proxy is None  # NO_PROXY names it
    assert (
        OpenAICompatibleBackend(
            model="m", base_url="https://x/v1", proxy="none", proxy_environment=environ
        ).proxy
        is None
    )


def test_through_the_gateway_behind_a_proxy_with_a_private_ca(
    authority: trustme.CA, tmp_path: Path, log_dir: Path
):
    """The README's example: an https upstream reached through a CONNECT proxy, its certificate
    issued by a private CA."""
    import httpx
    import yaml

    from tests.support.servers import running_gateway

    ca_file = write_pem(tmp_path / "ca.pem", authority.cert_pem)
    completion = (
        b'{"id":"x","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,'
        b'"message":{"role":"assistant","content":"hello from inside"},"finish_reason":"stop"}]}'
    )
    tls = tls_server_context(authority, False)
    with (
        ScriptedServer(fixed(200, completion, "content-type: application/json"), tls) as server,
        Proxy() as proxy,
    ):
        options = {"base_url": f"{server.url}/v1", "proxy": proxy.url, "ca_file": str(ca_file)}
        config = tmp_path / "config.yaml"
        config.write_text(
            yaml.safe_dump(
                {"deployments": [{"name": "m", "backend": "openai-compatible", "options": options}]}
            )
        )
        with running_gateway(log_dir, config) as url:
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=20)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == "hello from inside"
    assert [method for method, _, _ in proxy.seen] == ["CONNECT"]
