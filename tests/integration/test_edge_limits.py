"""What one client may hold of the gateway, tested with real sockets: the header block, the time
to send headers and body, idle connections, connections in all; and the connection's own errors
(a request the parser refuses) in the dialect's shape."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
import socket
import subprocess
import sys
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import uvicorn
from uvicorn.server import ServerState

from gateway.config.settings import ClientLimits
from gateway.server.edge import Connections, EdgeProtocol
from tests.support.documents import response_errors
from tests.support.gateway_process import GatewayProcess, gateway_process
from tests.support.servers import ROOT

pytestmark = pytest.mark.slow  # out of the fast lane (docs/development/tests.md)

LIMITS = {"header_timeout": 3, "body_timeout": 2, "keepalive_timeout": 2, "max_connections": 700}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    with gateway_process(tmp_path_factory.mktemp("edge"), {"server": {"clients": LIMITS}}) as process:
        yield process


def address(gateway: GatewayProcess) -> tuple[str, int]:
    host, _, port = gateway.url.removeprefix("http://").partition(":")
    return host, int(port)


def exchange(gateway: GatewayProcess, raw: bytes, timeout: float = 10) -> bytes:
    """Send raw bytes, read until the gateway closes (or the timeout)."""
    with socket.create_connection(address(gateway), timeout=timeout) as sock:
        with contextlib.suppress(OSError):  # it may close before reading everything: the point
            sock.sendall(raw)
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except (ConnectionResetError, TimeoutError):
            pass
    return received


def status_and_body(answer: bytes) -> tuple[int, dict]:
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), orjson.loads(body)


def rss_kib(gateway: GatewayProcess) -> int:
    for line in httpx.get(f"{gateway.url}/metrics").text.splitlines():
        if line.startswith("process_resident_memory_bytes "):
            return int(float(line.split()[1])) // 1024
    raise AssertionError("no process_resident_memory_bytes")


def test_a_huge_header_is_431_in_shape_before_it_is_read(gateway: GatewayProcess):
    before = rss_kib(gateway)
    for _ in range(3):
        raw = b"GET /v1/models HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * (16 * 1024 * 1024) + b"\r\n\r\n"
        started = time.monotonic()
        status, body = status_and_body(exchange(gateway, raw))
        assert time.monotonic() - started < 5
        assert status == 431
        assert response_errors("openai.yaml", "/models", "get", 400, body) == []  # OpenAI's error shape
    assert rss_kib(gateway) - before < 20 * 1024


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        (
            "Content-Length and Transfer-Encoding",
            b"POST /azure/chat/completions?api-version=2024-05-01-preview HTTP/1.1\r\nhost: x\r\n"
            b"content-length: 4\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n",
        ),
        (
            "two Content-Lengths",
            b"POST /azure/chat/completions?api-version=2024-05-01-preview HTTP/1.1\r\nhost: x\r\n"
            b"content-length: 2\r\ncontent-length: 3\r\n\r\n{}",
        ),
        ("not HTTP", b"HELLO /azure/info\r\n\r\n"),
    ],
)
def test_requests_the_parser_refuses_are_400_in_shape(gateway: GatewayProcess, name: str, raw: bytes):
    status, body = status_and_body(exchange(gateway, raw))
    assert status == 400, name
    if body.get("status"):  # the path was read: Azure's own flat shape
        assert body == {
            "error": {"code": "BadRequest", "message": body["message"]},
            "message": body["message"],
            "status": 400,
            "code": "BadRequest",
        }
    else:
        assert body["error"]["code"] == "BadRequest"


def test_headers_that_never_finish_are_408(gateway: GatewayProcess):
    with socket.create_connection(address(gateway), timeout=10) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nhost: x\r\n")
        started = time.monotonic()
        answer = sock.recv(65536)
        assert LIMITS["header_timeout"] - 0.5 < time.monotonic() - started < LIMITS["header_timeout"] + 3
    assert status_and_body(answer)[0] == 408


def test_a_body_that_never_ends_is_408(gateway: GatewayProcess):
    with socket.create_connection(address(gateway), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b'transfer-encoding: chunked\r\n\r\n5\r\n{"a":\r\n'
        )
        started = time.monotonic()
        answer = sock.recv(65536)
        assert time.monotonic() - started < LIMITS["body_timeout"] + 3
    assert status_and_body(answer)[0] == 408


def test_an_idle_connection_is_closed(gateway: GatewayProcess):
    with socket.create_connection(address(gateway), timeout=10) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        answer = b""
        while not answer.endswith(b'{"status":"ok"}'):  # head and body may come apart
            answer += sock.recv(65536)
        assert b"200 OK" in answer
        started = time.monotonic()
        assert sock.recv(65536) == b""  # closed by the gateway
        assert time.monotonic() - started < LIMITS["keepalive_timeout"] + 3


def test_a_compressed_body_is_415(gateway: GatewayProcess):
    answer = httpx.post(
        f"{gateway.url}/v1/chat/completions",
        content=b"\x1f\x8b\x08\x00",
        headers={"content-type": "application/json", "content-encoding": "gzip"},
    )
    assert answer.status_code == 415
    assert "uncompressed" in answer.json()["error"]["message"]


def test_a_key_given_twice_is_400_naming_it(gateway: GatewayProcess):
    raw = b'{"model": "echo", "messages": [{"role": "user", "content": "hi"}], "model": "other"}'
    answer = httpx.post(
        f"{gateway.url}/v1/chat/completions", content=raw, headers={"content-type": "application/json"}
    )
    assert answer.status_code == 400
    assert "'model' twice" in answer.json()["error"]["message"]


def test_deep_nesting_is_400(gateway: GatewayProcess):
    deep: object = "bottom"
    for _ in range(300):
        deep = {"x": deep}
    body = {"model": "echo", "messages": [{"role": "user", "content": "hi"}], "deep": deep}
    answer = httpx.post(
        f"{gateway.url}/v1/chat/completions", json=body, headers={"extra-parameters": "pass-through"}
    )
    assert answer.status_code == 400
    assert "deeper than 64" in answer.json()["error"]["message"]


SLOWLORIS = """
import asyncio, sys
async def loris(host, port, seconds):
    try:
        reader, writer = await asyncio.open_connection(host, port)
    except OSError:
        return "refused"
    request = b"GET /v1/models HTTP/1.1\\r\\nhost: x\\r\\nx-slow: " + b"a" * 200
    try:
        for byte in request:
            writer.write(bytes([byte]))
            await writer.drain()
            if reader.at_eof():
                return "closed"
            await asyncio.sleep(1)
        return "held"
    except OSError:
        return "closed"
    finally:
        writer.close()
async def main():
    host, port, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    results = await asyncio.gather(*(loris(host, port, 0) for _ in range(count)))
    print(results.count("closed"), results.count("held"), results.count("refused"))
asyncio.run(main())
"""


def test_a_slowloris_does_not_slow_anyone_else(gateway: GatewayProcess, tmp_path: Path):
    """500 connections sending their headers a byte a second: other clients are served as fast as
    ever (p99 < 100 ms), memory stays within 20 %, and the slow ones are cut at the header timeout."""
    before = rss_kib(gateway)
    host, port = address(gateway)
    loris = subprocess.Popen(
        [sys.executable, "-c", SLOWLORIS, host, str(port), "500"], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        time.sleep(1)
        latencies = []
        with httpx.Client() as client:
            ends = time.monotonic() + LIMITS["header_timeout"] + 1
            while time.monotonic() < ends:
                started = time.monotonic()
                answer = client.post(
                    f"{gateway.url}/v1/chat/completions",
                    json={"model": "echo", "messages": [{"role": "user", "content": "hi"}]},
                )
                latencies.append(time.monotonic() - started)
                assert answer.status_code == 200
                time.sleep(0.02)
        during = rss_kib(gateway)
        output, _ = loris.communicate(timeout=60)
    finally:
        loris.kill()
    latencies.sort()
    p99 = latencies[int(len(latencies) * 0.99) - 1]
    assert p99 < 0.1, f"p99 {p99 * 1000:.0f} ms over {len(latencies)} requests"
    closed, held, refused = map(int, output.split())
    assert closed == 500 and held == 0 and refused == 0, output
    assert during < before * 1.2, (before, during)


def test_connections_past_the_cap_are_closed_at_once(tmp_path: Path):
    """A worker holds at most `max_connections` (with no reserve for probes, as here); the next
    is closed before it can hold anything, and those held are served as usual."""
    limits = {"max_connections": 5, "probe_connections": 0}
    with gateway_process(tmp_path, {"server": {"clients": limits}}) as small:
        held = [socket.create_connection(address(small), timeout=5) for _ in range(5)]
        try:
            time.sleep(0.3)
            with socket.create_connection(address(small), timeout=5) as extra:
                assert extra.recv(1024) == b""  # closed by the gateway
            held[0].sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
            assert b"200 OK" in held[0].recv(65536)
        finally:
            for sock in held:
                sock.close()


BURST = """
import asyncio, resource, sys

async def connect(host, port):
    try:
        return await asyncio.wait_for(asyncio.open_connection(host, port), 3)
    except (OSError, TimeoutError):
        return None

async def main():
    host, port, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, count + 256), hard))
    connections = [c for c in await asyncio.gather(*(connect(host, port) for _ in range(count))) if c]
    print("connected", len(connections), flush=True)
    sys.stdin.readline()  # the gateway accepts again
    answered = 0
    for reader, writer in connections:
        writer.write(b"GET /health HTTP/1.1\\r\\nhost: x\\r\\nconnection: close\\r\\n\\r\\n")
        answered += (await asyncio.wait_for(reader.read(), 20)).startswith(b"HTTP/1.1 200")
        writer.close()
    print("answered", answered, flush=True)

asyncio.run(main())
"""


def test_a_burst_larger_than_uvicorns_backlog_waits_to_be_accepted(tmp_path: Path):
    """The listen backlog is sized from `max_connections`: 2,300 connections arriving while the
    worker accepts none (uvicorn's own backlog takes 2,048) all wait in the kernel's queue, and
    each is answered once the worker goes on. With 2,048, the rest were dropped (8,000 streams
    opened over a second: 840 of them reset)."""
    limits = {"max_connections": 2500}
    with gateway_process(tmp_path, {"server": {"clients": limits}}) as gateway:
        host, port = address(gateway)
        gateway.signal(signal.SIGSTOP)  # the worker accepts nothing: the kernel queues them
        burst = subprocess.Popen(
            [sys.executable, "-c", BURST, host, str(port), "2300"],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert burst.stdout is not None and burst.stdin is not None
            connected = burst.stdout.readline()
            gateway.signal(signal.SIGCONT)
            burst.stdin.write("\n")
            burst.stdin.flush()
            answered = burst.stdout.readline()
            burst.wait(timeout=60)
        finally:
            gateway.signal(signal.SIGCONT)
            burst.kill()
    assert connected.split() == ["connected", "2300"]
    assert answered.split() == ["answered", "2300"]


async def ok_app(scope: dict, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


async def served_and_closed() -> list[weakref.ref]:
    """Connections to a real EdgeProtocol server, each answered and closed: weak references to
    their protocols."""
    config = uvicorn.Config(ok_app, log_config=None, lifespan="off")
    config.load()
    state, shared, made = ServerState(), Connections(), []

    def protocol() -> EdgeProtocol:
        edge = EdgeProtocol(
            config=config,
            server_state=state,
            app_state={},
            limits=ClientLimits(),
            max_body_bytes=1024,
            render_error=lambda status, message, path: (b"{}", b"application/json"),
            shared=shared,
        )
        made.append(weakref.ref(edge))
        return edge

    server = await asyncio.get_running_loop().create_server(protocol, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    for _ in range(20):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        assert (await reader.read()).endswith(b"ok")
        writer.close()
    await asyncio.sleep(0.1)  # the server's side of each connection is lost
    server.close()
    await server.wait_closed()
    return made


def test_a_closed_connection_is_freed_without_the_cycle_collector():
    """Nothing refers back to a connection's protocol once it is closed, so its objects go at
    once: with the cycle collector off (as after gc.freeze, with thresholds raised, it nearly is)
    every protocol of 20 closed connections is gone. A burst of 8,000 streams left 90,000
    objects waiting for a full collection."""
    gc.collect()
    gc.disable()
    try:
        made = asyncio.run(served_and_closed())
        assert len(made) == 20
        assert [ref for ref in made if ref() is not None] == []
    finally:
        gc.enable()


def test_memory_goes_back_once_a_burst_of_connections_is_mostly_gone():
    """A burst's memory is handed back when three quarters of its connections are gone (again
    for each quarter after, down to a few hundred); a few connections coming and going never
    plan a release."""

    async def main() -> list[bool]:
        loop = asyncio.get_running_loop()
        planned = []
        shared = Connections()
        for count in range(1, 301):
            shared.held(count)
        for count in range(299, 74, -1):  # 300 → 75: a quarter of the most left
            shared.let_go(count, loop)
            planned.append(shared.release_planned)
        shared.release()
        few = Connections()
        for count in (1, 2, 3, 2, 1, 0, 100, 0):
            few.held(count)
            few.let_go(count, loop)
        planned.append(few.release_planned)
        return planned

    planned = asyncio.run(main())
    assert planned[:-2] == [False] * (len(planned) - 2) and planned[-2] is True
    assert planned[-1] is False
