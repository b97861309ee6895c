"""The Python floors: the least a Python pass-through can do under uvicorn.

A raw ASGI app with one pooled HTTP client: it forwards the request body to the same path on
the upstream (BENCH_UPSTREAM, e.g. http://127.0.0.1:8081) and returns the answer — whole for
JSON, piece by piece as it arrives for a stream. No routing, validation or policy.

Two clients, two floors. `app` uses aiohttp, the usual pooled client (the floor the goals are
set against). `lean_app` uses chatgate's own pool
(backends.upstream_http), so chatgate/lean floor is what chatgate's own work costs with the
upstream hop the same on both sides.

    BENCH_UPSTREAM=http://127.0.0.1:8081 uvicorn bench.floor:app --loop uvloop --http httptools
"""

from __future__ import annotations

import os

import aiohttp

from backends.upstream_http import Pool

UPSTREAM = os.environ.get("BENCH_UPSTREAM", "http://127.0.0.1:8081")
PASSED_HEADERS = ("content-type", "cache-control")
MAX_CONNECTIONS = 100


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


class AiohttpFloor(Floor):
    session: aiohttp.ClientSession

    def open(self) -> None:
        connector = aiohttp.TCPConnector(limit=MAX_CONNECTIONS, keepalive_timeout=300)
        self.session = aiohttp.ClientSession(connector=connector, auto_decompress=False)

    async def close(self) -> None:
        await self.session.close()

    async def proxy(self, path: str, body: bytes, send) -> None:
        async with self.session.post(
            self.upstream + path, data=body, headers={"content-type": "application/json"}
        ) as response:
            headers = passed(response.headers)
            if response.content_type == "text/event-stream":
                await send({"type": "http.response.start", "status": response.status, "headers": headers})
                async for piece in response.content.iter_any():
                    await send({"type": "http.response.body", "body": piece, "more_body": True})
                await send({"type": "http.response.body", "body": b""})
                return
            answer = await response.read()
        await send_whole(send, response.status, headers, answer)


class LeanFloor(Floor):
    pool: Pool

    def open(self) -> None:
        self.pool = Pool(
            self.upstream,
            {"content-type": "application/json"},
            max_connections=MAX_CONNECTIONS,
            max_keepalive=MAX_CONNECTIONS,
            keepalive_seconds=300,
            connect_timeout=5,
        )

    async def close(self) -> None:
        await self.pool.aclose()

    async def proxy(self, path: str, body: bytes, send) -> None:
        response = await self.pool.post(path, body)
        try:
            headers = passed(response.headers)
            if response.headers.get("content-type", "").startswith("text/event-stream"):
                await send({"type": "http.response.start", "status": response.status, "headers": headers})
                while piece := await response.read_some():
                    await send({"type": "http.response.body", "body": piece, "more_body": True})
                await send({"type": "http.response.body", "body": b""})
                return
            answer = await response.read()
        finally:
            response.close()
        await send_whole(send, response.status, headers, answer)


app = AiohttpFloor(UPSTREAM)
lean_app = LeanFloor(UPSTREAM)
