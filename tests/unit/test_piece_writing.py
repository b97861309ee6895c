"""A stream's pieces written straight to the connection behind the edge (PieceWritingCycle's
`piece_writer`): the same bytes uvicorn's `send` writes for the same pieces, nothing once the
client has gone, a wait while the connection holds too much, and `send` itself for every answer
that is not a chunked one whose head went out. Elsewhere (another server) `piece_writer` sends
each piece as an ASGI message."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Coroutine
from typing import Any

import orjson
import pytest
from asgi_lifespan import LifespanManager
from uvicorn.protocols.http.flow_control import FlowControl

from gateway.app import create_app
from gateway.config.settings import Settings
from gateway.http.streaming import piece_writer
from gateway.server.edge_writing import PieceWritingCycle


def in_a_loop(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(test(*args, **kwargs))

    return run


PIECES = [b"data: {}\n\n", b"x" * 70_000, b"\n", b"event: error\ndata: {}\n\n"]


class Written:
    """A transport that keeps what is written to it."""

    def __init__(self) -> None:
        self.data = bytearray()

    def write(self, data: bytes) -> None:
        self.data += data

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass


class CountedCycle(PieceWritingCycle):
    """Counts the messages that go through `send`, and the writers it offers."""

    sent: list[str]
    offered = 0

    async def send(self, message: Any) -> None:
        self.sent.append(message["type"])
        await super().send(message)

    def piece_writer(self) -> Any:
        write = super().piece_writer()
        self.offered += write is not None
        return write


def cycle(method: str = "POST", scope: dict[str, Any] | None = None) -> tuple[CountedCycle, Written]:
    transport = Written()
    made = CountedCycle(
        scope=scope or {"type": "http", "method": method, "http_version": "1.1", "path": "/"},
        transport=transport,
        flow=FlowControl(transport),
        logger=logging.getLogger("test"),
        access_logger=logging.getLogger("test.access"),
        access_log=False,
        default_headers=[],
        message_event=asyncio.Event(),
        expect_100_continue=False,
        keep_alive=True,
        on_response=lambda: None,
    )
    made.sent = []
    return made, transport


async def started(made: PieceWritingCycle, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    await made.send({"type": "http.response.start", "status": 200, "headers": headers or []})


async def writing() -> tuple[CountedCycle, Written, Callable[[bytes], Any]]:
    """A chunked answer whose head went out, and the writer it offers."""
    made, written = cycle()
    await started(made)
    write = made.piece_writer()
    assert write is not None
    return made, written, write


@in_a_loop
async def test_the_pieces_are_the_bytes_uvicorns_send_writes():
    by_send, sent = cycle()
    by_writer, written = cycle()
    for made in (by_send, by_writer):
        await started(made, [(b"content-type", b"text/event-stream")])
    for piece in PIECES:
        await by_send.send({"type": "http.response.body", "body": piece, "more_body": True})
        write = by_writer.piece_writer()
        assert write is not None
        assert write(piece) is None  # nothing to wait for: the connection takes it
    for made in (by_send, by_writer):
        await made.send({"type": "http.response.body", "body": b"", "more_body": False})
    assert bytes(written.data) == bytes(sent.data)
    head, _, body = bytes(written.data).partition(b"\r\n\r\n")
    assert b"transfer-encoding: chunked" in head
    assert body == b"".join(b"%x\r\n%b\r\n" % (len(piece), piece) for piece in PIECES) + b"0\r\n\r\n"


@pytest.mark.parametrize("case", ["an empty piece, which would end the body", "the client has gone"])
@in_a_loop
async def test_nothing_is_written(case: str):
    made, written, write = await writing()
    made.disconnected = case == "the client has gone"
    before = bytes(written.data)
    assert write(b"" if case.startswith("an empty") else b"data: {}\n\n") is None
    assert bytes(written.data) == before


@in_a_loop
async def test_the_writer_waits_while_the_connection_holds_too_much():
    made, written, write = await writing()
    made.flow.pause_writing()
    waiting = write(b"data: {}\n\n")
    assert waiting is not None
    assert written.data.endswith(b"a\r\ndata: {}\n\n\r\n")  # written, then the wait
    task = asyncio.ensure_future(waiting)
    await asyncio.sleep(0.01)
    assert not task.done()
    made.flow.resume_writing()
    await asyncio.wait_for(task, 1)
    assert write(b"more") is None


@pytest.mark.parametrize("case", ["head not sent", "a HEAD request", "a known length", "ended"])
@in_a_loop
async def test_other_answers_have_no_writer_of_their_own(case: str):
    made, _ = cycle("HEAD" if case == "a HEAD request" else "POST")
    if case == "a known length":
        await started(made, [(b"content-length", b"3")])
    elif case != "head not sent":
        await started(made)
    if case == "ended":
        await made.send({"type": "http.response.body", "body": b"", "more_body": False})
    assert made.piece_writer() is None


@in_a_loop
async def test_elsewhere_each_piece_is_an_asgi_message():
    messages: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        messages.append(message)

    write = piece_writer(send)
    for piece in PIECES:
        waiting = write(piece)
        assert waiting is not None
        await waiting
    assert messages == [{"type": "http.response.body", "body": piece, "more_body": True} for piece in PIECES]


@in_a_loop
async def test_behind_the_edge_the_cycles_writer_is_used_and_send_is_not():
    made, written = cycle()
    await started(made)
    write = piece_writer(made.send)
    assert getattr(write, "__qualname__", "").startswith("PieceWritingCycle.piece_writer")
    assert write(b"data: {}\n\n") is None
    assert written.data.endswith(b"a\r\ndata: {}\n\n\r\n")
    headless, _ = cycle()  # its head not sent: the send underneath, which refuses a body first
    fallback = piece_writer(headless.send)
    with pytest.raises(RuntimeError, match=r"http\.response\.start"):
        await fallback(b"data: {}\n\n")


def dechunked(body: bytes) -> bytes:
    pieces = []
    while True:
        size, _, body = body.partition(b"\r\n")
        if int(size, 16) == 0:
            assert body == b"\r\n", "the last chunk ends the body"
            return b"".join(pieces)
        pieces.append(body[: int(size, 16)])
        assert body[int(size, 16) : int(size, 16) + 2] == b"\r\n"
        body = body[int(size, 16) + 2 :]


@in_a_loop
async def test_the_apps_stream_behind_the_edge_sends_only_its_head_and_its_end():
    """The whole app, as the edge serves it: a streamed answer's pieces all go through the
    cycle's writer, none through `send` (no wrapper of `send` hides the cycle from the stream)."""
    settings = Settings.model_validate(
        {"deployments": [{"name": "echo", "backend": "echo", "models": ["*"]}]}
    )
    body = orjson.dumps(
        {
            "model": "echo",
            "stream": True,
            "messages": [{"role": "user", "content": "one two three four five"}],
        }
    )
    async with LifespanManager(create_app(settings)) as started:
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": "/v1/chat/completions",
            "raw_path": b"/v1/chat/completions",
            "query_string": b"",
            "root_path": "",
            "headers": [(b"host", b"gateway"), (b"content-type", b"application/json")],
            "client": ("127.0.0.1", 50000),
            "server": ("127.0.0.1", 8080),
            "state": {},
        }
        made, written = cycle(scope=scope)
        requests = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive() -> dict[str, Any]:
            if requests:
                return requests.pop()
            await asyncio.Event().wait()  # the client stays until the answer ends
            raise AssertionError("unreachable")

        await started.app(scope, receive, made.send)
    assert made.sent == ["http.response.start", "http.response.body"]  # the head, then the end
    assert made.offered == 1
    head, _, chunked = bytes(written.data).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"transfer-encoding: chunked" in head
    events = dechunked(chunked).split(b"\n\n")
    assert events[-2:] == [b"data: [DONE]", b""]
    text = "".join(
        (orjson.loads(event[6:])["choices"] or [{}])[0].get("delta", {}).get("content") or ""
        for event in events[:-2]
    )
    assert "one two three four five" in text
