"""A raw asyncio server on a loopback port, run in its own thread; subclasses define `handle`."""

from __future__ import annotations

import asyncio
import ssl
import threading
from typing import Any, Self


class LoopbackServer:
    thread_name = "loopback-server"
    ssl_context: ssl.SSLContext | None = None  # set for a TLS server

    def __init__(self, port: int = 0) -> None:
        self.port = port  # 0: any free one
        self.loop = asyncio.new_event_loop()
        self.tasks: set[asyncio.Task] = set()
        self.url = ""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            serving = asyncio.start_server(self.handle, "127.0.0.1", self.port, ssl=self.ssl_context)
            self.server = self.loop.run_until_complete(serving)
            scheme = "https" if self.ssl_context is not None else "http"
            self.url = f"{scheme}://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
            ready.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, name=self.thread_name, daemon=True)
        self.thread.start()
        assert ready.wait(10), f"{self.thread_name} did not start"
        return self

    def __exit__(self, *exc_info: Any) -> None:
        asyncio.run_coroutine_threadsafe(self.shutdown(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()

    async def shutdown(self) -> None:
        self.server.close()
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


async def read_request(reader: asyncio.StreamReader) -> tuple[str, str, dict[str, str], bytes]:
    """One HTTP/1.1 request with a Content-Length body: (method, target, lower-case headers, body)."""
    head = await reader.readuntil(b"\r\n\r\n")
    request_line, *header_lines = head.decode("latin-1").split("\r\n")
    method, target = request_line.split(" ")[:2]
    headers = {
        name.strip().lower(): value.strip()
        for name, _, value in (line.partition(":") for line in header_lines if line)
    }
    return method, target, headers, await reader.readexactly(int(headers.get("content-length", "0")))
