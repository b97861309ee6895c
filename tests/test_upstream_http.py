"""backends.upstream_http against a raw HTTP/1.1 server on loopback that each test scripts."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable

import pytest
import trustme

from backends.upstream_http import ConnectError, Pool, PoolTimeout, ProtocolError
from tests.loopback_server import LoopbackServer
from tests.servers import free_port

Answer = Callable[[bytes, asyncio.StreamWriter], Awaitable[bool]]  # False: hang up after it


class ScriptedServer(LoopbackServer):
    """Reads each request (head and content-length body) and lets `answer` write the response."""

    thread_name = "scripted-http"

    def __init__(self, answer: Answer) -> None:
        super().__init__()
        self.answer = answer
        self.connections = 0
        self.requests: list[bytes] = []
        self.hung_up = asyncio.Event()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.tasks.add(asyncio.current_task())
        self.connections += 1
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    self.hung_up.set()
                    return
                length = next(
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                request = head + await reader.readexactly(length)
                self.requests.append(request)
                if not await self.answer(request, writer):
                    writer.close()
                    return
        finally:
            self.tasks.discard(asyncio.current_task())


def fixed(status: int, body: bytes, *headers: str) -> Answer:
    async def answer(request: bytes, writer: asyncio.StreamWriter) -> bool:
        lines = [f"HTTP/1.1 {status} X", f"content-length: {len(body)}", *headers]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        await writer.drain()
        return True

    return answer


def pool_for(server: ScriptedServer, **limits: float) -> Pool:
    options = {"max_connections": 4, "max_keepalive": 4, "keepalive_seconds": 30.0, "connect_timeout": 2.0}
    return Pool(server.url + "/v1", {"authorization": "Bearer k", "x-team": "a"}, **{**options, **limits})


def run(coroutine: Awaitable) -> object:
    return asyncio.run(asyncio.wait_for(coroutine, 20))


async def bodies_of(server: ScriptedServer, requests: int, pause: float = 0.0) -> list[bytes]:
    """POST `requests` times one after another through one pool; each answer's whole body."""
    pool = pool_for(server)
    bodies = []
    for _ in range(requests):
        response = await pool.post("/x", b"{}")
        bodies.append(await response.read())
        response.close()
        await asyncio.sleep(pause)
    await pool.aclose()
    return bodies


def test_answers_are_read_whole_over_one_kept_alive_connection():
    with ScriptedServer(fixed(200, b'{"ok": true}', "content-type: application/json")) as server:

        async def go() -> list[tuple[int, str, bytes]]:
            pool = pool_for(server)
            seen = []
            for _ in range(5):
                response = await pool.post("/v1/chat/completions", b'{"a": 1}')
                seen.append((response.status, response.headers["content-type"], await response.read()))
                response.close()
            await pool.aclose()
            return seen

        seen = run(go())
    assert seen == [(200, "application/json", b'{"ok": true}')] * 5
    assert server.connections == 1
    head = server.requests[0].decode()
    assert head.startswith("POST /v1/chat/completions HTTP/1.1\r\n")
    lowered = head.lower()
    for line in (f"host: 127.0.0.1:{server.url.rsplit(':', 1)[1]}", "authorization: bearer k", "x-team: a"):
        assert line in lowered
    assert "content-length: 8\r\n" in lowered and head.endswith('\r\n\r\n{"a": 1}')


def test_a_chunked_answer_arrives_piece_by_piece():
    release = asyncio.Event()

    async def answer(request: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        writer.write(b"6\r\nfirst\n\r\n")
        await writer.drain()
        await release.wait()
        writer.write(b"7\r\nsecond\n\r\n0\r\n\r\n")
        await writer.drain()
        return True

    with ScriptedServer(answer) as server:

        async def go() -> tuple[bytes, bytes, bytes]:
            pool = pool_for(server)
            response = await pool.post("/v1/chat/completions", b"{}")
            first = await response.read_some()
            server.loop.call_soon_threadsafe(release.set)
            second = await response.read_some()
            end = await response.read_some()
            response.close()
            assert len(pool.idle) == 1  # read to its end: kept for the next request
            await pool.aclose()
            return first, second, end

        assert run(go()) == (b"first\n", b"second\n", b"")


def test_a_body_that_ends_with_the_connection_is_read_and_the_connection_not_kept():
    async def answer(request: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nall of it")
        await writer.drain()
        return False

    with ScriptedServer(answer) as server:
        assert run(bodies_of(server, 2)) == [b"all of it"] * 2
    assert server.connections == 2


def test_an_upstream_that_hangs_up_mid_answer_is_a_protocol_error():
    async def answer(request: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly part")
        await writer.drain()
        return False

    with ScriptedServer(answer) as server:

        async def go() -> None:
            pool = pool_for(server)
            response = await pool.post("/x", b"{}")
            try:
                await response.read()
            finally:
                response.close()
                await pool.aclose()

        with pytest.raises(ProtocolError, match="closed the connection mid-response"):
            run(go())


def test_a_malformed_answer_is_a_protocol_error():
    async def answer(request: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"this is not http\r\n\r\n")
        await writer.drain()
        return True

    with ScriptedServer(answer) as server, pytest.raises(ProtocolError, match="malformed"):
        run(pool_for(server).post("/x", b"{}"))


def test_a_refused_connection_is_a_connect_error():
    pool = Pool(f"http://127.0.0.1:{free_port()}", {}, max_connections=1, max_keepalive=1,
                keepalive_seconds=1, connect_timeout=2)  # fmt: skip
    with pytest.raises(ConnectError):
        run(pool.post("/x", b"{}"))


def test_a_full_pool_waits_for_a_connection_then_times_out():
    with ScriptedServer(fixed(200, b"{}")) as server:

        async def go() -> tuple[int, bool]:
            pool = pool_for(server, max_connections=1, connect_timeout=0.3)
            held = await pool.post("/x", b"{}")
            with pytest.raises(PoolTimeout):
                await pool.post("/x", b"{}")
            # a request waiting for the busy connection gets it once the first is done
            waiting = asyncio.ensure_future(pool.post("/x", b"{}"))
            await asyncio.sleep(0.05)
            await held.read()
            held.close()
            second = await waiting
            await second.read()
            second.close()
            await pool.aclose()
            return second.status, waiting.done()

        assert run(go()) == (200, True)
    assert server.connections == 1


def test_an_abandoned_answer_closes_its_connection_and_frees_its_slot():
    async def answer(request: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n")
        await writer.drain()
        return True  # and never ends the body

    with ScriptedServer(answer) as server:

        async def go() -> None:
            pool = pool_for(server, max_connections=1)
            for _ in range(2):
                response = await pool.post("/x", b"{}")
                assert await response.read_some() == b"hello"
                response.close()  # the client went away
            assert not pool.idle
            await pool.aclose()

        run(go())
        assert asyncio.run_coroutine_threadsafe(server.hung_up.wait(), server.loop).result(5) is True
    assert server.connections == 2


def test_a_connection_the_upstream_closed_while_idle_is_not_reused():
    async def answer(request: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()
        await asyncio.sleep(0.05)
        return False  # keep-alive was promised, but the server hangs up when idle

    with ScriptedServer(answer) as server:
        assert run(bodies_of(server, 3, pause=0.2)) == [b"ok"] * 3
    assert server.connections == 3


def test_a_large_answer_is_read_whole_through_flow_control():
    payload = bytes(range(256)) * (4 * 4096)  # 4 MiB, more than the read buffer limit

    with ScriptedServer(fixed(200, payload)) as server:

        async def go() -> bytes:
            pool = pool_for(server)
            response = await pool.post("/x", b"{}")
            pieces = []
            while piece := await response.read_some():
                pieces.append(piece)
                await asyncio.sleep(0)
            response.close()
            await pool.aclose()
            return b"".join(pieces)

        assert run(go()) == payload


def test_https_with_the_certificate_checked():
    authority = trustme.CA()
    served = authority.issue_cert("127.0.0.1")
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    served.configure_cert(server_context)
    client_context = ssl.create_default_context()
    authority.configure_trust(client_context)

    async def go() -> tuple[int, bytes]:
        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            await reader.readexactly(2)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 6\r\n\r\nsecret")
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=server_context)
        port = server.sockets[0].getsockname()[1]
        options = {"max_connections": 1, "max_keepalive": 1, "keepalive_seconds": 5, "connect_timeout": 5}
        try:
            pool = Pool(f"https://127.0.0.1:{port}/v1", {}, ssl_context=client_context, **options)
            response = await pool.post("/v1/chat/completions", b"{}")
            body = await response.read()
            response.close()
            await pool.aclose()
            # without the authority's certificate the same server is refused
            untrusting = Pool(f"https://127.0.0.1:{port}/v1", {}, **options)
            with pytest.raises(ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                await untrusting.post("/v1/chat/completions", b"{}")
            return response.status, body
        finally:
            server.close()

    assert run(go()) == (200, b"secret")
