"""A loopback HTTP/1.1 server for the media tests: image URLs to fetch (the path picks what it
does) and an OpenAI-compatible chat endpoint that keeps what the gateway sent it."""

from __future__ import annotations

import asyncio
import http
import threading
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

import orjson

from tests.support.loopback_server import LoopbackServer, read_request

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4  # a small "image"
BIG_BYTES = 3 * 1024 * 1024  # what /big.png and /endless.png send; the tests allow less


@dataclass
class Seen:
    """One request the server received."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes


class MediaUpstream(LoopbackServer):
    """GET /zebra.png an image; /big.png one over the tests' cap, its length announced;
    /endless.png one that does not say its length; /page.html no image; /gzip.png an image sent
    encoded; /slow.png no answer; /redirect?to=URL a 302 to URL; /loop a redirect to itself.
    POST /v1/chat/completions answers "ok" (the request is kept in `seen`)."""

    thread_name = "media-upstream"

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[Seen] = []
        self.slow_hung_up = threading.Event()  # the client of /slow.png went away

    def requests_to(self, path: str) -> list[Seen]:
        return [seen for seen in self.seen if urlsplit(seen.path).path == path]

    def chat_bodies(self) -> list[dict[str, Any]]:
        return [orjson.loads(seen.body) for seen in self.requests_to("/v1/chat/completions")]

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        try:
            method, target, headers, body = await read_request(reader)
            self.seen.append(Seen(method, target, headers, body))
            await self.answer(method, target, reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            self.tasks.discard(task)

    async def answer(
        self, method: str, target: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        path, query = urlsplit(target).path, parse_qs(urlsplit(target).query)
        if method == "POST" and path == "/v1/chat/completions":
            message = {"role": "assistant", "content": "ok"}
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": "stop"}
            body = {"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": [choice]}
            await respond(writer, 200, orjson.dumps(body), "application/json")
        elif path == "/zebra.png":
            await respond(writer, 200, PNG, "image/png")
        elif path == "/big.png":
            await respond(writer, 200, b"\0" * BIG_BYTES, "image/png")
        elif path == "/endless.png":
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: image/png\r\nconnection: close\r\n\r\n")
            for _ in range(BIG_BYTES // 65536):
                writer.write(b"\0" * 65536)
                await writer.drain()
        elif path == "/page.html":
            await respond(writer, 200, b"<html>not an image</html>", "text/html")
        elif path == "/gzip.png":
            await respond(writer, 200, PNG, "image/png", {"content-encoding": "gzip"})
        elif path == "/held.png":  # `bytes` of a twice larger image, then nothing until hung up on
            size = int(query["bytes"][0])
            head = f"HTTP/1.1 200 OK\r\ncontent-type: image/png\r\ncontent-length: {2 * size}\r\n\r\n"
            writer.write(head.encode() + b"\0" * size)
            await writer.drain()
            await reader.read()
        elif path == "/slow.png":
            await reader.read()  # answers nothing; returns when the client hangs up
            self.slow_hung_up.set()
        elif path == "/redirect":
            await respond(writer, 302, b"", "text/plain", {"location": query["to"][0]})
        elif path == "/loop":
            await respond(writer, 302, b"", "text/plain", {"location": "/loop"})
        else:
            await respond(writer, 404, b"no such image", "text/plain")


async def respond(
    writer: asyncio.StreamWriter,
    status: int,
    body: bytes,
    media_type: str,
    headers: dict[str, str] | None = None,
) -> None:
    lines = [f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}", f"content-type: {media_type}",
             f"content-length: {len(body)}", "connection: close"]  # fmt: skip
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
    await writer.drain()
