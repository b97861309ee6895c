"""The Python floor: the least a Python pass-through can do under uvicorn.

A raw ASGI app with one pooled HTTP client: it forwards the request body to the same path on
the upstream (BENCH_UPSTREAM, e.g. http://127.0.0.1:8081) and returns the answer — whole for
JSON, piece by piece as it arrives for a stream. No routing, validation or policy.

The client is chatgate's own (backends.http.client, with the openai-compatible backend's
default limits), so the upstream hop costs the same on both sides and chatgate/floor is what
chatgate's own work costs.

    BENCH_UPSTREAM=http://127.0.0.1:8081 uvicorn bench.floor:app --loop uvloop --http httptools
"""

from __future__ import annotations

import os

from backends.http.client import Limits, UpstreamClient
from backends.openai_compatible import Options

UPSTREAM = os.environ.get("BENCH_UPSTREAM", "http://127.0.0.1:8081")
PASSED_HEADERS = ("content-type", "cache-control")
# upstream connections at once; 0: no cap (the concurrency point's thousands of streams, each
# holding one, as chatgate's deployment with `max_concurrent` above them does)
MAX_CONNECTIONS = int(os.environ.get("BENCH_MAX_CONNECTIONS", "100")) or None
DEFAULTS = Options(base_url=UPSTREAM)  # the backend's defaults: the same client settings as chatgate
LIMITS = Limits(
    connect=DEFAULTS.connect,
    max_connections=MAX_CONNECTIONS,
    keepalive_seconds=DEFAULTS.keepalive_seconds,
    max_header_bytes=DEFAULTS.max_header_bytes,
    max_response_bytes=DEFAULTS.max_response_bytes,
)


def passed(headers) -> list[tuple[bytes, bytes]]:
    return [(name.encode(), headers[name].encode()) for name in PASSED_HEADERS if name in headers]


async def whole_body(receive) -> bytes:
    body = b""
    more = True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    return body


async def send_whole(send, status: int, headers: list[tuple[bytes, bytes]], answer: bytes) -> None:
    headers.append((b"content-length", str(len(answer)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": answer})


class Floor:
    """The ASGI side; subclasses open, use and close one client."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            await self.lifespan(receive, send)
        elif scope["type"] == "http":
            await self.proxy(scope["path"], await whole_body(receive), send)

    async def lifespan(self, receive, send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.open()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    def open(self) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError

    async def proxy(self, path: str, body: bytes, send) -> None:
        raise NotImplementedError


class ClientFloor(Floor):
    client: UpstreamClient

    def open(self) -> None:
        self.client = UpstreamClient(self.upstream, {"content-type": "application/json"}, LIMITS)

    async def close(self) -> None:
        await self.client.aclose()

    async def proxy(self, path: str, body: bytes, send) -> None:
        answer = await self.client.post(path, body)
        try:
            headers = passed(answer.headers)
            if answer.media_type == "text/event-stream":
                await send({"type": "http.response.start", "status": answer.status, "headers": headers})
                while piece := await answer.read_some():
                    await send({"type": "http.response.body", "body": piece, "more_body": True})
                await send({"type": "http.response.body", "body": b""})
                return
            data = await answer.read()
        finally:
            answer.close()
        await send_whole(send, answer.status, headers, data)


app = ClientFloor(UPSTREAM)
