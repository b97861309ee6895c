"""An OpenAI-compatible upstream that misbehaves on purpose, for the hostile-upstream matrix.

A raw asyncio HTTP/1.1 server in a thread (keep-alive: several requests per connection). The
request's last message says what to do: `case:<name>` (CASES lists them); anything else is
answered well. It remembers which connection carried each answer, which answers it broke on
purpose, and any request that arrived on a connection after such an answer (`reused_broken`:
the gateway must never send one).
"""

from __future__ import annotations

import asyncio
import gzip
import itertools
from collections import Counter
from typing import Any

import orjson

from tests.support.loopback_server import LoopbackServer

TEXT = "fine answer"
BIG_TEXT = "x" * (2 * 1024 * 1024)  # a 2 MiB answer: over the old pool's 1 MiB read buffer
PIECE = 64 * 1024
UPSTREAM_ID = b"x-request-id: upstream-4711\r\n"
USAGE = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}

# case → what the answer does; `broken`: the connection is unusable after it
CASES = {
    "ok": "a well-formed answer",
    "big-length": "a 2 MiB answer with Content-Length",
    "big-chunked": "a 2 MiB answer, chunked",
    "huge-length": "Content-Length: 64 MiB, then the body until the gateway hangs up",
    "huge-chunked": "64 MiB in chunks, until the gateway hangs up",
    "chunk-size-2^64": "a chunk size of 2**64",
    "endless": "a chunked body that never ends",
    "drip": "the body one byte a second",
    "bad-status-line": "HTTP/1.1 2x0",
    "continue": "100 Continue before the answer",
    "early-hints": "103 Early Hints before the answer",
    "huge-header": "one header of 1 MB",
    "many-headers": "5,000 headers",
    "header-block": "100 headers of 1 KB each: every line short, the block over 64 KiB",
    "closed-mid-body": "Content-Length 1000, 100 bytes, then the connection closes",
    "closed-mid-stream": "one SSE event, then the connection closes",
    "closed-as-written": "a kept-alive connection closed as the next request arrives",
    "gzip": "a gzip-encoded body (although `identity` was asked for)",
    "json-lines": "the stream as application/jsonlines (LMI): no data:, no [DONE]",
    "sse-comments": "SSE with comments, event: and id: lines",
    "crlf": "SSE with CRLF line ends",
    "split": "SSE events split across TCP writes, three bytes at a time",
}
BROKEN = {
    "huge-length", "huge-chunked", "chunk-size-2^64", "endless", "drip", "bad-status-line",
    "huge-header", "many-headers", "header-block", "closed-mid-body", "closed-mid-stream",
}  # fmt: skip


def completion(text: str = TEXT) -> bytes:
    return orjson.dumps(
        {
            "id": "chatcmpl-hostile",
            "object": "chat.completion",
            "created": 1,
            "model": "hostile",
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
            ],
            "usage": USAGE,
        }
    )


def chunk_payload(delta: dict[str, Any], finish: str | None = None, usage: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": "chatcmpl-hostile",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "hostile",
        "choices": [] if usage else [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    if usage:
        body["usage"] = USAGE
    return body


STREAM_PAYLOADS = [
    chunk_payload({"role": "assistant", "content": "fine"}),
    chunk_payload({"content": " answer"}),
    chunk_payload({}, "stop"),
    chunk_payload({}, usage=True),
]


def sse(payloads: list[dict[str, Any]], line_end: bytes = b"\n", extras: bool = False) -> bytes:
    events = []
    for number, payload in enumerate(payloads):
        lines = [b"data: " + orjson.dumps(payload)]
        if extras:
            lines = [b": a comment", b"event: message", f"id: {number}".encode(), *lines, b"retry: 1000"]
        events.append(line_end.join(lines) + line_end + line_end)
    return b"".join(events) + b"data: [DONE]" + line_end + line_end


def json_lines() -> bytes:
    """LMI's stream: one chunk per line; its top_logprobs may hold a token id, a number."""
    payloads = [dict(p) for p in STREAM_PAYLOADS]
    first = payloads[0]["choices"][0]
    first["logprobs"] = [
        {"content": [{"token": "fine", "logprob": -0.1, "top_logprobs": [{"token": 4711, "logprob": -0.1}]}]}
    ]
    return b"".join(orjson.dumps(p) + b"\n" for p in payloads)


class HostileUpstream(LoopbackServer):
    thread_name = "hostile-upstream"

    def __init__(self) -> None:
        super().__init__()
        self.ids = itertools.count(1)
        self.served: list[tuple[int, str]] = []  # (connection, case) per request, in order
        self.broken_connections: set[int] = set()
        self.reused_broken: list[tuple[int, str]] = []
        self.dropped = Counter[str]()  # requests hung up on without an answer, by case
        self.open_connections = 0
        self.drop_next: set[int] = set()  # connections whose next request is dropped unanswered

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        connection = next(self.ids)
        self.open_connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                body = orjson.loads(await reader.readexactly(length))
                content = body["messages"][-1]["content"]
                case = content.removeprefix("case:") if content.startswith("case:") else "ok"
                if connection in self.broken_connections:
                    self.reused_broken.append((connection, case))
                if connection in self.drop_next:  # closed just as the request arrived
                    self.drop_next.discard(connection)
                    self.dropped[case] += 1
                    writer.transport.abort()
                    return
                self.served.append((connection, case))
                if case in BROKEN:
                    self.broken_connections.add(connection)
                if not await self.answer(case, bool(body.get("stream")), writer, connection):
                    return
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            self.open_connections -= 1
            writer.close()
            self.tasks.discard(task)

    async def answer(self, case: str, stream: bool, writer: asyncio.StreamWriter, connection: int) -> bool:
        """Answer one request; False: the connection is closed after it."""
        if case == "closed-as-written":
            # answered well; the next request on this connection finds it closed
            self.drop_next.add(connection)
            case = "ok"
        if case == "ok":
            if stream:
                await send_chunked(writer, "text/event-stream", [sse(STREAM_PAYLOADS)])
            else:
                await send(writer, 200, completion())
        elif case == "big-length":
            await send(writer, 200, completion(BIG_TEXT))
        elif case == "big-chunked":
            body = completion(BIG_TEXT)
            await send_chunked(
                writer, "application/json", [body[i : i + PIECE] for i in range(0, len(body), PIECE)]
            )
        elif case == "huge-length":
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
                % (64 << 20)
            )
            await forever(writer, lambda: b" " * PIECE, 64 << 20)
            return False
        elif case in ("huge-chunked", "endless"):
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
            )
            piece = b"%x\r\n%s\r\n" % (PIECE, b" " * PIECE)
            await forever(writer, lambda: piece, (64 << 20) if case == "huge-chunked" else None)
            return False
        elif case == "chunk-size-2^64":
            writer.write(
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n10000000000000000\r\n" + b"{" * 100
            )
            await writer.drain()
            await asyncio.sleep(30)
            return False
        elif case == "drip":
            body = completion()
            kind = b"text/event-stream" if stream else b"application/json"
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n" % (kind, len(body))
            )
            for byte in body:
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(1)
            return False
        elif case == "bad-status-line":
            writer.write(b"HTTP/1.1 2x0 OK\r\ncontent-length: 2\r\n\r\n{}")
        elif case in ("continue", "early-hints"):
            interim = b"HTTP/1.1 100 Continue\r\n\r\n"
            if case == "early-hints":
                interim = b"HTTP/1.1 103 Early Hints\r\nlink: </style.css>; rel=preload\r\n\r\n"
            writer.write(interim)
            await writer.drain()
            await asyncio.sleep(0.05)
            if stream:
                await send_chunked(writer, "text/event-stream", [sse(STREAM_PAYLOADS)])
            else:
                await send(writer, 200, completion())
        elif case in ("huge-header", "many-headers", "header-block"):
            if case == "huge-header":
                extra = b"x-huge: " + b"h" * 1_000_000 + b"\r\n"
            elif case == "many-headers":
                extra = b"".join(b"x-h%d: v\r\n" % i for i in range(5000))
            else:
                extra = b"".join(b"x-h%d: %s\r\n" % (i, b"v" * 1000) for i in range(100))
            body = completion()
            writer.write(b"HTTP/1.1 200 OK\r\n" + extra + b"content-length: %d\r\n\r\n%s" % (len(body), body))
            await writer.drain()
            await asyncio.sleep(30)
            return False
        elif case == "closed-mid-body":
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n")
            writer.write(completion()[:100])
            await writer.drain()
            return False
        elif case == "closed-mid-stream":
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            )
            event = sse(STREAM_PAYLOADS[:1]).removesuffix(b"data: [DONE]\n\n")
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
            await writer.drain()
            return False
        elif case == "gzip":
            body = gzip.compress(completion())
            await send(writer, 200, body, b"content-encoding: gzip\r\n")
        elif case == "json-lines":
            await send_chunked(writer, "application/jsonlines", [json_lines()])
        elif case == "sse-comments":
            await send_chunked(writer, "text/event-stream", [sse(STREAM_PAYLOADS, extras=True)])
        elif case == "crlf":
            await send_chunked(writer, "text/event-stream", [sse(STREAM_PAYLOADS, line_end=b"\r\n")])
        elif case == "split":
            body = sse(STREAM_PAYLOADS)
            await send_chunked(
                writer, "text/event-stream", [body[i : i + 3] for i in range(0, len(body), 3)], 0.001
            )
        else:
            raise AssertionError(f"unknown case {case}")
        await writer.drain()
        return True


async def send(writer: asyncio.StreamWriter, status: int, body: bytes, extra: bytes = b"") -> None:
    writer.write(
        b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%s%s\r\n"
        % (status, len(body), UPSTREAM_ID, extra)
        + body
    )
    await writer.drain()


async def send_chunked(
    writer: asyncio.StreamWriter, content_type: str, pieces: list[bytes], pause: float = 0.0
) -> None:
    writer.write(
        b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\ntransfer-encoding: chunked\r\n\r\n" % content_type.encode()
    )
    for piece in pieces:
        writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
        await writer.drain()
        if pause:
            await asyncio.sleep(pause)
    writer.write(b"0\r\n\r\n")
    await writer.drain()


async def forever(writer: asyncio.StreamWriter, piece: Any, limit: int | None) -> None:
    """Write pieces until `limit` bytes (None: no end) or the gateway hangs up."""
    sent = 0
    while limit is None or sent < limit:
        data = piece()
        writer.write(data)
        sent += len(data)
        await writer.drain()
