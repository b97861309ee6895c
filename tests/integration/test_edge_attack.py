"""The edge under attack, with real sockets against a real `chatgate serve`: clients that never
read their answers, connections that pin the cap, pipelined requests that come while an answer
is being written, HTTP/1.0 and `Expect`, and streams to slow readers. Scaled down from the
attacks they reproduce (100 × 30 MB non-readers, 1,000 × 150 pipelined, 2,000 slow streams)."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import orjson
import pytest

from tests.integration.test_edge_limits import address, rss_kib, status_and_body
from tests.support.documents import response_errors
from tests.support.gateway_process import GatewayProcess, gateway_process

pytestmark = pytest.mark.slow  # out of the fast lane (docs/development/tests.md)

SMALL_RECEIVE_BUFFER = 4096  # a client that reads nothing takes little into its own kernel
WRITE_TIMEOUT = 2


def chat(body: dict, version: bytes = b"HTTP/1.1", extra: bytes = b"", close: bool = True) -> bytes:
    raw = orjson.dumps(body)
    if close:
        extra += b"connection: close\r\n"
    return (
        b"POST /v1/chat/completions " + version + b"\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n" % len(raw) + extra + b"\r\n" + raw
    )


def echo_of(prompt_words: int, n: int, stream: bool = False) -> dict:
    """An echo request whose answer is about `prompt_words` × 10 bytes × n (×25 streamed)."""
    return {
        "model": "echo",
        "messages": [{"role": "user", "content": "abcdefghi " * prompt_words}],
        "n": n,
        "max_tokens": 1_000_000,
        "stream": stream,
    }


def connected(gateway: GatewayProcess, receive_buffer: int | None = SMALL_RECEIVE_BUFFER) -> socket.socket:
    sock = socket.socket()
    if receive_buffer:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.settimeout(10)
    sock.connect(address(gateway))
    return sock


def read_to_end(sock: socket.socket, timeout: float = 10) -> tuple[bytes, str]:
    """Everything until the gateway closes: (bytes, "closed" | "reset" | "timeout")."""
    sock.settimeout(timeout)
    received = bytearray()
    try:
        while chunk := sock.recv(1 << 20):
            received += chunk
    except ConnectionResetError:
        return bytes(received), "reset"
    except TimeoutError:
        return bytes(received), "timeout"
    return bytes(received), "closed"


def exchange(gateway: GatewayProcess, raw: bytes) -> bytes:
    with connected(gateway, None) as sock:
        sock.sendall(raw)
        return read_to_end(sock)[0]


def dechunk(body: bytes) -> tuple[bytes, bytes]:
    """A chunked body decoded, and what follows its last chunk; ValueError where it is broken."""
    decoded = bytearray()
    at = 0
    while True:
        line_end = body.index(b"\r\n", at)
        size = int(body[at:line_end], 16)  # ValueError: not a chunk size
        start = line_end + 2
        if size == 0:
            if body[start : start + 2] != b"\r\n":
                raise ValueError("no end after the last chunk")
            return bytes(decoded), body[start + 2 :]
        if body[start + size : start + size + 2] != b"\r\n":
            raise ValueError("a chunk shorter than its size")
        decoded += body[start : start + size]
        at = start + size + 2


def split_answer(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, rest = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split(" ", 2)[1]), headers, rest


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """A gateway that reads bodies briefly and takes a few pipelined requests."""
    limits = {"body_timeout": 1, "max_pipelined": 4}
    with gateway_process(tmp_path_factory.mktemp("edge-attack"), {"server": {"clients": limits}}) as process:
        yield process


@pytest.fixture(scope="module")
def impatient(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """A gateway that cuts a client taking nothing of its answer after 2 s."""
    limits = {"write_timeout": WRITE_TIMEOUT}
    with gateway_process(tmp_path_factory.mktemp("edge-attack"), {"server": {"clients": limits}}) as process:
        yield process


@contextlib.contextmanager
def closing_all(socks: list[socket.socket]) -> Iterator[list[socket.socket]]:
    try:
        yield socks
    finally:
        for sock in socks:
            sock.close()


@contextlib.contextmanager
def asked_by_clients_that_read_nothing(
    gateway: GatewayProcess, request: bytes, count: int = 20
) -> Iterator[list[socket.socket]]:
    """`count` clients that have sent `request` and read nothing yet."""
    with closing_all([connected(gateway) for _ in range(count)]) as clients:
        for sock in clients:
            sock.sendall(request)
        yield clients


# ----- 4: a client that never reads its answer ----------------------------------------------------


def test_a_client_that_reads_nothing_is_cut_and_what_it_held_freed(impatient: GatewayProcess):
    """20 clients ask for a 4 MB answer and read none of it: within two write timeouts each is
    cut (what reaches it afterwards is a truncated answer, then the end), and the gateway's
    memory is back near where it was while they still hold their sockets. Before: every answer
    was held whole for as long as the client liked (100 × 30 MB: 5.9 GB)."""
    request = chat(echo_of(50_000, 8))
    full = len(exchange(impatient, request))
    assert full > 3_000_000
    before = rss_kib(impatient)
    with asked_by_clients_that_read_nothing(impatient, request) as clients:
        time.sleep(2 * WRITE_TIMEOUT + 3)  # cut, and the memory handed back a second later
        held = rss_kib(impatient) - before
        for sock in clients:
            received, end = read_to_end(sock)
            assert end in ("closed", "reset")
            assert len(received) < full, "the client got its whole answer: it was never cut"
    assert held < 40 * 1024, f"{held // 1024} MB still held for clients that read nothing"


def test_a_slow_reader_that_keeps_reading_is_not_cut(impatient: GatewayProcess):
    """The write deadline is about progress, not speed: a client taking its answer a little at a
    time, for longer than the write timeout in all, gets all of it."""
    with connected(impatient) as sock:
        sock.sendall(chat(echo_of(2_000, 4, stream=True)))
        received = bytearray()
        ends = time.monotonic() + 2 * WRITE_TIMEOUT + 1
        while time.monotonic() < ends:
            received += sock.recv(16384)
            time.sleep(0.2)
        rest, _ = read_to_end(sock, timeout=5)
    status, _, body = split_answer(bytes(received) + rest)
    assert status == 200
    events, _ = dechunk(body)
    assert events.endswith(b"data: [DONE]\n\n")


def test_a_stream_is_made_no_faster_than_its_client_takes_it(impatient: GatewayProcess):
    """20 clients ask for a stream of megabytes and take none of it: behind the edge the pieces
    go straight to the connection (gateway/server/edge_writing.py, PieceWritingCycle), and the
    relay waits once the connection holds its limit, so the gateway holds a little of each
    stream, not the whole of it, until the clients are cut."""
    request = chat(echo_of(50_000, 8, stream=True))
    full = len(exchange(impatient, request))
    assert full > 5_000_000
    before = rss_kib(impatient)
    with asked_by_clients_that_read_nothing(impatient, request):
        time.sleep(0.75 * WRITE_TIMEOUT)  # before any is cut; unchecked, each grows all the while
        held = (rss_kib(impatient) - before) * 1024
    assert held < 20 * full / 10, f"{held // 2**20} MB held for streams of {20 * full // 2**20} MB in all"


# ----- 5: the connection cap, pinned without a key -------------------------------------------------

PIPELINED_DOCUMENTS = b"GET /v1/openapi.json HTTP/1.1\r\nhost: x\r\n\r\n" * 150
MODELS = b"GET /v1/models HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"


def test_probes_are_answered_and_others_refused_in_shape_while_the_cap_is_pinned(tmp_path: Path):
    """Every connection a worker takes is held by a client pipelining spec documents it never
    reads. /health and /ready still answer; any other request gets 503 in its dialect's shape
    with `connection: close` (it was closed unanswered); past the probes' reserve a connection
    is closed at once; the pinning connections are cut after the write timeout, and the worker
    serves as before."""
    limits = {"max_connections": 10, "probe_connections": 2, "write_timeout": WRITE_TIMEOUT}
    with gateway_process(tmp_path, {"server": {"clients": limits}}) as gateway:
        with closing_all([connected(gateway) for _ in range(10)]) as pinning:
            for sock in pinning:
                sock.sendall(PIPELINED_DOCUMENTS)
            time.sleep(0.5)
            for path in (b"/health", b"/ready"):
                status, headers, _ = split_answer(
                    exchange(gateway, b"GET %s HTTP/1.1\r\nhost: x\r\n\r\n" % path)
                )
                assert (status, headers["connection"]) == (200, "close"), path
            azure = chat(echo_of(3, 1)).replace(
                b"/v1/chat/completions", b"/azure/chat/completions?api-version=2024-05-01-preview"
            )
            status, headers, body = split_answer(exchange(gateway, azure))
            assert (status, headers["connection"]) == (503, "close")
            assert response_errors("azure.yaml", "/chat/completions", "post", 503, orjson.loads(body)) == []
            status, answer = status_and_body(exchange(gateway, MODELS))
            assert status == 503
            assert response_errors("openai.yaml", "/models", "get", 400, answer) == []
            with closing_all([connected(gateway, None) for _ in range(2)]) as reserve:
                time.sleep(0.3)
                with connected(gateway, None) as extra:
                    assert read_to_end(extra) == (b"", "closed")  # past the reserve too
                reserve[0].sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
                assert split_answer(read_to_end(reserve[0])[0])[0] == 200
            time.sleep(2 * WRITE_TIMEOUT + 1)
            for sock in pinning:
                assert read_to_end(sock)[1] in ("closed", "reset")
        assert status_and_body(exchange(gateway, MODELS))[0] == 200


def test_requests_pipelined_past_the_bound_are_refused_after_the_answers_before_them(
    gateway: GatewayProcess,
):
    """One answer being written and `max_pipelined` waiting: the next request is 503, in order
    after theirs, and nothing more is read from the connection. Before, each of 150 pipelined
    requests a client sent without reading was taken and held."""
    received = exchange(gateway, b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n" * 40)
    statuses = []
    while received:
        status, headers, rest = split_answer(received)
        length = int(headers["content-length"])
        statuses.append(status)
        body, received = rest[:length], rest[length:]
    assert statuses == [200] * 5 + [503]
    assert b"wait on this connection" in body


# ----- 12: an answer to a pipelined request, never inside another ------------------------------------


@pytest.mark.parametrize(
    ("refused", "status"),
    [
        # its body never finishes: 408 after body_timeout
        (b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{", 408),
        # its headers are too large: 431
        (b"GET /v1/models HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 70_000 + b"\r\n\r\n", 431),
    ],
    ids=["408", "431"],
)
def test_a_refused_pipelined_request_is_answered_after_the_stream_before_it(
    gateway: GatewayProcess, refused: bytes, status: int
):
    """A stream is being sent (to a client that reads it late) when the request pipelined behind
    it is refused: the stream goes out whole, then the refusal, then the connection closes.
    Before, the 408 or 431 was written into the middle of the stream's chunked body."""
    with connected(gateway) as sock:
        sock.sendall(chat(echo_of(4_000, 8, stream=True), close=False) + refused)
        time.sleep(3)  # past the body timeout, with the stream still being written
        received, end = read_to_end(sock, timeout=20)
    assert end == "closed"
    first, headers, body = split_answer(received)
    assert (first, headers["transfer-encoding"]) == (200, "chunked")
    events, after = dechunk(body)
    assert events.endswith(b"data: [DONE]\n\n")
    assert events.count(b"data: ") > 30_000
    second, answer = status_and_body(after)
    assert second == status
    assert response_errors("openai.yaml", "/models", "get", 400, answer) == []


# ----- 13: HTTP/1.0 and Expect ----------------------------------------------------------------------------


def test_an_http_1_0_stream_is_not_chunked_and_ends_with_the_connection(gateway: GatewayProcess):
    status, headers, body = split_answer(exchange(gateway, chat(echo_of(20, 2, stream=True), b"HTTP/1.0")))
    assert status == 200
    assert "transfer-encoding" not in headers and "content-length" not in headers
    assert headers["connection"] == "close"
    assert body.startswith(b"data: {") and body.endswith(b"data: [DONE]\n\n")  # no chunk sizes
    # an answer whose length is known keeps its Content-Length
    status, headers, body = split_answer(exchange(gateway, chat(echo_of(20, 1), b"HTTP/1.0")))
    assert status == 200 and int(headers["content-length"]) == len(body)
    assert orjson.loads(body)["object"] == "chat.completion"


def test_expect_100_continue_for_a_body_over_the_limit_is_413_before_any_100(gateway: GatewayProcess):
    raw = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: 99999999\r\nexpect: 100-continue\r\n\r\n"
    )
    with connected(gateway, None) as sock:
        sock.sendall(raw)
        received, end = read_to_end(sock, timeout=5)
    assert end == "closed"
    status, answer = status_and_body(received)  # the first thing it says: no 100, no 408
    assert status == 413
    assert "4194304 bytes" in answer["error"]["message"]


def test_expect_100_continue_within_the_limit_is_answered_100_then_served(gateway: GatewayProcess):
    request = chat(echo_of(3, 1), extra=b"expect: 100-continue\r\n")
    head, _, body = request.partition(b"\r\n\r\n")
    with connected(gateway, None) as sock:
        sock.sendall(head + b"\r\n\r\n")
        assert sock.recv(65536) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(body)
        received, _ = read_to_end(sock)
    assert split_answer(received)[0] == 200


def test_an_unknown_expectation_is_417(gateway: GatewayProcess):
    status, answer = status_and_body(exchange(gateway, chat(echo_of(3, 1), extra=b"expect: 200-ok\r\n")))
    assert status == 417
    assert "100-continue" in answer["error"]["message"]


# ----- 14: streams to slow readers -------------------------------------------------------------------


def unacknowledged_per_connection(port: int) -> list[int]:
    """The kernel's send queue (bytes the client has not acknowledged) of each of the gateway's
    established connections, from /proc/net/tcp."""
    queues = []
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local_port = int(fields[1].split(":")[1], 16)
        if local_port == port and fields[3] == "01":  # established
            queues.append(int(fields[4].split(":")[0], 16))
    return queues


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads Linux's /proc/net/tcp")
def test_a_stream_to_a_slow_reader_waits_for_it(gateway: GatewayProcess):
    """40 streams of about 2 MB to clients that take little: the gateway computes each only a
    little ahead of its reader (the socket holds at most `unsent_bytes` it has not sent, where
    the kernel grew it to the whole 2 MB stream before), answers /health meanwhile, and each
    stream still arrives whole once its client reads on."""
    port = address(gateway)[1]
    with closing_all([connected(gateway) for _ in range(40)]) as readers:
        for sock in readers:
            sock.sendall(chat(echo_of(2_000, 4, stream=True)))
        time.sleep(3)
        queues = unacknowledged_per_connection(port)
        assert split_answer(exchange(gateway, b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n"))[0] == 200
        # every client reads on at once: read one after another, the last would wait past the
        # write deadline (30 s) for the 39 before it, and be cut as a reader that takes nothing
        with ThreadPoolExecutor(len(readers)) as pool:
            answers = list(pool.map(lambda sock: read_to_end(sock, timeout=20)[0], readers))
        for received in answers:
            status, _, body = split_answer(received)
            events, _ = dechunk(body)
            assert status == 200 and events.endswith(b"data: [DONE]\n\n")
            assert len(events) > 2_000_000
    assert len(queues) >= 40
    assert max(queues) < 512 * 1024, f"a slow reader's socket held {max(queues) // 1024} KiB"
