"""A stream's pieces written straight to the connection behind the edge (PieceWritingCycle's
`piece_writer`): the same bytes uvicorn's `send` writes for the same pieces, nothing once the
client has gone, a wait while the connection holds too much, and `send` itself for every answer
that is not a chunked one whose head went out. Elsewhere (another server) `piece_writer` sends
each piece as an ASGI message."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from typing import Any
from unittest import mock

import orjson
import pytest

from gateway.config.settings import Settings
from gateway.core.turns import turns_of
from gateway.http.streaming import piece_writer
from gateway.server.edge_writing import CoalescingTransport, PieceWritingCycle
from tests.support.edge_cycle import CountedCycle, Written, cycle, dechunked, served


def in_a_loop(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(test(*args, **kwargs))

    return run


PIECES = [b"data: {}\n\n", b"x" * 70_000, b"\n", b"event: error\ndata: {}\n\n"]


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


def framed(piece: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(piece), piece)


@in_a_loop
async def test_behind_the_edge_a_turns_first_piece_goes_out_at_once_and_the_rest_together():
    """At a model's pace each piece comes alone in its turn: it is written at once, not held
    for the turn's end (a callback and its call for the same one system call). A burst's later
    pieces in the same turn are joined into one write; the next turn's first goes at once again
    once the loop's turn count knows of that turn (a relay's read that waited says so:
    gateway/core/turns.py). A turn nobody counted holds its piece until its end."""
    made, written = cycle(coalescing=True)
    await started(made)
    await asyncio.sleep(0)  # the head goes out at the turn's end, as the edge writes it
    assert len(written.writes) == 1
    write = made.piece_writer()
    assert write is not None
    assert write(b"one") is None
    assert written.writes[1:] == [framed(b"one")]  # at once, before the loop ran
    write(b"two")
    write(b"three")
    assert len(written.writes) == 2  # held: the turn has written at once already
    await asyncio.sleep(0)
    assert written.writes[2:] == [framed(b"two") + framed(b"three")]
    await asyncio.sleep(0)  # a turn passes between two pieces at a model's pace,
    turns_of(asyncio.get_running_loop()).waited()  # and the relay's read says it waited
    write(b"four")
    assert written.writes[3:] == [framed(b"four")]
    await asyncio.sleep(0)  # a turn nobody counted (a backend whose reads say nothing)
    write(b"five")
    assert len(written.writes) == 4  # held: the edge cannot tell this turn from the last
    await asyncio.sleep(0)
    assert written.writes[4:] == [framed(b"five")]  # and written at that turn's end


@in_a_loop
async def test_behind_the_edge_a_piece_never_goes_before_what_is_held():
    made, written = cycle(coalescing=True)
    await started(made)  # the head, held until the turn's end
    write = made.piece_writer()
    assert write is not None
    write(b"first")
    assert len(written.writes) == 0
    await asyncio.sleep(0)
    assert len(written.writes) == 1 and written.writes[0].endswith(framed(b"first"))
    written.closing = True  # the connection is closing: nothing is written at once, nor later
    write(b"late")
    await asyncio.sleep(0)
    assert len(written.writes) == 1


@in_a_loop
async def test_behind_the_edge_a_streams_last_piece_goes_out_with_its_end():
    """The piece that ends the answer (`last`) waits for the stream's end (its done line, the
    body's last chunk), written in the same turn: one write, not two."""
    made, written = cycle(coalescing=True)
    await started(made)
    await asyncio.sleep(0)
    write = made.piece_writer()
    assert write is not None
    await asyncio.sleep(0)
    write(b"the end", True)
    write(b"[DONE]", True)
    await made.send({"type": "http.response.body", "body": b"", "more_body": False})
    assert len(written.writes) == 1
    await asyncio.sleep(0)
    assert written.writes[1:] == [framed(b"the end") + framed(b"[DONE]") + b"0\r\n\r\n"]


@pytest.mark.parametrize("coalescing", [False, True])
@in_a_loop
async def test_the_apps_stream_behind_the_edge_sends_only_its_head_and_its_end(coalescing: bool):
    """The whole app, as the edge serves it: a streamed answer's pieces all go through the
    cycle's writer, none through `send` (no wrapper of `send` hides the cycle from the stream).
    On the edge's transport the answer's last piece (its finish and usage) goes out in one
    write with the done line and the body's end."""
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
    made, written = await served(settings, "/v1/chat/completions", body, coalescing)
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
    if coalescing:
        last = written.writes[-1]
        assert b'"finish_reason":"stop"' in last and last.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n")
        assert len(written.writes) < len(events) - 2  # not a write a chunk: echo's come at once


PASSED_ON = {
    # asyncio.Transport's methods that the edge's transport hands to the one it wraps, as is
    "get_extra_info": ("peername", "unknown"),
    "is_closing": (),
    "set_protocol": ("protocol",),
    "get_protocol": (),
    "is_reading": (),
    "pause_reading": (),
    "resume_reading": (),
    "set_write_buffer_limits": (100, 10),
    "get_write_buffer_limits": (),
    "can_write_eof": (),
}


def test_the_edges_transport_offers_all_of_asyncios_transport():
    """The transport behind the edge has no `__getattr__` (which made each attribute lookup of
    its own a slow one): every public method of asyncio.Transport is one of its own."""
    public = {name for name in dir(asyncio.Transport) if not name.startswith("_")}
    assert public <= set(dir(CoalescingTransport))
    assert "__getattr__" not in vars(CoalescingTransport)
    assert public - set(PASSED_ON) == {
        "write", "writelines", "write_eof", "close", "abort", "get_write_buffer_size"
    }  # fmt: skip


@pytest.mark.parametrize("name", sorted(PASSED_ON))
@in_a_loop
async def test_the_edges_transport_passes_the_rest_on(name: str):
    wrapped = mock.Mock()
    transport = CoalescingTransport(wrapped, asyncio.get_running_loop(), lambda: None)
    answer = getattr(transport, name)(*PASSED_ON[name])
    getattr(wrapped, name).assert_called_once_with(*PASSED_ON[name])
    if name.startswith(("get_", "is_", "can_")):
        assert answer is getattr(wrapped, name).return_value


@in_a_loop
async def test_the_edges_transport_joins_writelines_with_what_is_held():
    made, written = cycle(coalescing=True)
    transport = made.transport
    transport.write(b"head ")
    transport.writelines([b"one ", b"two"])
    assert written.writes == []  # held until the turn ends
    await asyncio.sleep(0)
    assert written.writes == [b"head one two"]
