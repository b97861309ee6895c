"""The Python floor: the least a Python pass-through can do under uvicorn.

A raw ASGI app with one pooled aiohttp client: it forwards the request body to the same path
on the upstream (BENCH_UPSTREAM, e.g. http://127.0.0.1:8081) and returns the answer — whole
for JSON, piece by piece as it arrives for a stream. No routing, validation or policy.

    BENCH_UPSTREAM=http://127.0.0.1:8081 uvicorn bench.floor:app --loop uvloop --http httptools
"""

from __future__ import annotations

import os

import aiohttp

UPSTREAM = os.environ.get("BENCH_UPSTREAM", "http://127.0.0.1:8081")
PASSED_HEADERS = ("content-type", "cache-control")


class Floor:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.session: aiohttp.ClientSession | None = None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            await self.lifespan(receive, send)
        elif scope["type"] == "http":
            await self.proxy(scope, receive, send)

    async def lifespan(self, receive, send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                connector = aiohttp.TCPConnector(limit=100, keepalive_timeout=300)
                self.session = aiohttp.ClientSession(connector=connector, auto_decompress=False)
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.session is not None:
                    await self.session.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def proxy(self, scope, receive, send) -> None:
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        assert self.session is not None, "uvicorn must run the lifespan (--lifespan on)"
        async with self.session.post(
            self.upstream + scope["path"], data=body, headers={"content-type": "application/json"}
        ) as response:
            headers = [
                (name.encode(), response.headers[name].encode())
                for name in PASSED_HEADERS
                if name in response.headers
            ]
            if response.content_type == "text/event-stream":
                await send({"type": "http.response.start", "status": response.status, "headers": headers})
                async for piece in response.content.iter_any():
                    await send({"type": "http.response.body", "body": piece, "more_body": True})
                await send({"type": "http.response.body", "body": b""})
                return
            answer = await response.read()
        headers.append((b"content-length", str(len(answer)).encode()))
        await send({"type": "http.response.start", "status": response.status, "headers": headers})
        await send({"type": "http.response.body", "body": answer})


app = Floor(UPSTREAM)
