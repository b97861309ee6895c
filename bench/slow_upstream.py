"""An upstream at an LLM's pace, for the concurrency point: the bench's 64-chunk stream (the one
nginx serves at once), one chunk every `--gap-ms` to every open stream.

nginx cannot pace a response by event (`limit_rate` counts bytes per second), so this is a
small uvloop server with a raw protocol: one timer for all streams, each tick writing the next
chunk of every stream that has room in its socket (TCP back-pressure pauses a stream whose
reader is behind). `python -m bench.slow_upstream PORT GAP_MS`; any POST gets the stream.
"""

from __future__ import annotations

import asyncio
import sys

import uvloop

from bench.upstream import stream_body

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
END = b"0\r\n\r\n"


def chunked_events() -> list[bytes]:
    """The stream's data events (the last one [DONE]), each as one HTTP chunk."""
    events = [event + b"\n\n" for event in stream_body().split(b"\n\n") if event]
    return [f"{len(event):x}\r\n".encode() + event + b"\r\n" for event in events]


class Upstream:
    def __init__(self, gap: float) -> None:
        self.gap = gap
        self.events = chunked_events()
        self.streaming: set[Stream] = set()

    def tick(self, loop: asyncio.AbstractEventLoop, at: float) -> None:
        events, last = self.events, len(self.events) - 1
        for stream in list(self.streaming):
            if stream.paused:
                continue
            index = stream.sent
            stream.transport.write(events[index] + END if index == last else events[index])
            if index == last:
                self.streaming.discard(stream)
            else:
                stream.sent = index + 1
        at += self.gap  # a fixed schedule: a slow tick does not push the next ones back
        loop.call_at(max(at, loop.time()), self.tick, loop, at)


class Stream(asyncio.Protocol):
    def __init__(self, upstream: Upstream) -> None:
        self.upstream = upstream
        self.received = b""
        self.sent = 0
        self.paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.received += data
        end = self.received.find(b"\r\n\r\n")
        if end < 0:
            return
        head = self.received[:end].lower()
        marker = head.find(b"content-length:")
        length = int(head[marker + 15 :].split(b"\r\n", 1)[0]) if marker >= 0 else 0
        if len(self.received) < end + 4 + length:
            return
        self.received = self.received[end + 4 + length :]
        self.transport.write(HEAD + self.upstream.events[0])  # the first chunk at once
        self.sent = 1
        self.upstream.streaming.add(self)

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False

    def connection_lost(self, exc: Exception | None) -> None:
        self.upstream.streaming.discard(self)


async def serve(port: int, gap: float) -> None:
    loop = asyncio.get_running_loop()
    upstream = Upstream(gap)
    server = await loop.create_server(lambda: Stream(upstream), "127.0.0.1", port, backlog=16384)
    loop.call_soon(upstream.tick, loop, loop.time())
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    uvloop.run(serve(int(sys.argv[1]), int(sys.argv[2]) / 1000))
