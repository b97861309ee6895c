"""An HTTP/1.1 answer's cycle as the edge runs it (gateway/server/edge_writing.py), on a transport
that keeps each write: what a stream writes, and in how many system calls."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from asgi_lifespan import LifespanManager
from uvicorn.protocols.http.flow_control import FlowControl

from gateway.app import create_app
from gateway.config.settings import Settings
from gateway.server.edge_writing import CoalescingTransport, PieceWritingCycle


class Written:
    """A transport that keeps what is written to it."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.writes: list[bytes] = []  # each write (a system call on a socket)
        self.closing = False

    def write(self, data: bytes) -> None:
        self.data += data
        self.writes.append(bytes(data))

    def get_write_buffer_size(self) -> int:
        return 0

    def is_closing(self) -> bool:
        return self.closing

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


def cycle(
    method: str = "POST", scope: dict[str, Any] | None = None, coalescing: bool = False
) -> tuple[CountedCycle, Written]:
    """A cycle on a transport that keeps what is written: as the edge has it (`coalescing`, its
    writes of a turn joined into one), or plain."""
    transport = Written()
    made = CountedCycle(
        scope=scope or {"type": "http", "method": method, "http_version": "1.1", "path": "/"},
        transport=(
            CoalescingTransport(transport, asyncio.get_running_loop(), lambda: None)  # type: ignore[arg-type]
            if coalescing
            else transport
        ),
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


async def served(
    settings: Settings, path: str, body: bytes, coalescing: bool = True
) -> tuple[CountedCycle, Written]:
    """The whole app, started, answering one POST of `body` to `path` on a cycle of its own, as
    the edge serves it; the client stays until the answer ends."""
    async with LifespanManager(create_app(settings)) as started:
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": [(b"host", b"gateway"), (b"content-type", b"application/json")],
            "client": ("127.0.0.1", 50000),
            "server": ("127.0.0.1", 8080),
            "state": {},
        }
        made, written = cycle(scope=scope, coalescing=coalescing)
        requests = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive() -> dict[str, Any]:
            if requests:
                return requests.pop()
            await asyncio.Event().wait()  # the client stays until the answer ends
            raise AssertionError("unreachable")

        await started.app(scope, receive, made.send)
        await asyncio.sleep(0)  # what the last turn held goes out
    return made, written


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
