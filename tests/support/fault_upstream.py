"""An OpenAI-compatible upstream that misbehaves on demand, for fault-injection tests.

A raw asyncio HTTP/1.1 server in a thread. The first path segment picks the behaviour:
`ok`, `slow-<ms>`, `reset` (stream, then drop the socket), `reset-once` (the first streamed
request `reset`, all else `ok`), `stall` (never answer),
`stall-mid` (one chunk, then silence), `malformed`, `flaky` (500 once, then ok),
`busy` (429 with Retry-After: 1), `fail…` (500; `POST /control/heal/<name>` makes it ok),
`role-then-reset` (a stream whose first chunk holds only the role, then the socket dropped),
`drip-<ms>` (a stream whose every chunk comes <ms> after the one before), `late-end` (a stream
sent at once but for the body's last chunk, which comes 50 ms after the `[DONE]` line).
It counts requests per behaviour, keeps the traceparent each request came with, and knows how
many connections are open.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import orjson

from tests.support.loopback_server import LoopbackServer

COMPLETION = {
    "id": "chatcmpl-up",
    "object": "chat.completion",
    "created": 1,
    "model": "up",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "fine answer"}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
}


def chunk(delta: dict[str, Any], finish: str | None = None, usage: dict | None = None) -> bytes:
    body: dict[str, Any] = {
        "id": "chatcmpl-up",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "up",
        "choices": [] if usage else [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    if usage:
        body["usage"] = usage
    return b"data: " + orjson.dumps(body) + b"\n\n"


STREAM = [
    chunk({"role": "assistant", "content": "fine"}),
    chunk({"content": " answer"}),
    chunk({}, "stop"),
    chunk({}, usage={"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}),
    b"data: [DONE]\n\n",
]


class FaultUpstream(LoopbackServer):
    thread_name = "fault-upstream"

    def __init__(self, port: int = 0) -> None:
        super().__init__(port)
        self.counts: Counter[str] = Counter()
        self.open_connections = 0
        self.answering: Counter[str] = Counter()  # requests being answered now, by behaviour
        self.healed: set[str] = set()
        self.flaky_seen = 0
        self.dropped_once = False  # reset-once's stream dropped
        self.traceparents: list[tuple[str, str | None]] = []  # (behaviour, header) per request

    def base_url(self, behaviour: str) -> str:
        return f"{self.url}/{behaviour}/v1"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self.tasks.add(task)
        self.open_connections += 1
        try:
            while True:  # keep-alive: several requests per connection
                head = await reader.readuntil(b"\r\n\r\n")
                line, *header_lines = head.decode("latin-1").split("\r\n")
                path = line.split(" ")[1]
                headers = {
                    k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines if h)
                }
                raw = await reader.readexactly(int(headers.get("content-length", "0")))
                behaviour = path.strip("/").split("/")[0]
                if behaviour == "control":
                    self.healed.add(path.rstrip("/").split("/")[-1])
                    await respond(writer, 200, b"{}")
                    continue
                self.counts[behaviour] += 1
                self.traceparents.append((behaviour, headers.get("traceparent")))
                stream = bool(orjson.loads(raw).get("stream")) if raw else False
                self.answering[behaviour] += 1
                try:
                    keep_open = await self.answer(behaviour, stream, reader, writer)
                finally:
                    self.answering[behaviour] -= 1
                if not keep_open:
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            self.open_connections -= 1
            writer.close()
            self.tasks.discard(task)

    async def answer(
        self, behaviour: str, stream: bool, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """Answer one request; False closes the connection."""
        if behaviour.startswith("slow-"):
            await asyncio.sleep(int(behaviour.removeprefix("slow-")) / 1000)
            behaviour = "ok"
        if behaviour == "flaky":
            self.flaky_seen += 1
            behaviour = "status-500" if self.flaky_seen == 1 else "ok"
        if behaviour == "reset-once":
            behaviour = "reset" if stream and not self.dropped_once else "ok"
            self.dropped_once = self.dropped_once or stream
        if behaviour.startswith("fail"):
            behaviour = "ok" if behaviour in self.healed else "status-500"
        if behaviour == "busy":
            await respond(writer, 429, error_body("busy"), {"Retry-After": "1"})
        elif behaviour.startswith("status-"):
            status = int(behaviour.removeprefix("status-"))
            await respond(writer, status, error_body(f"upstream {status}"))
        elif behaviour == "malformed":
            await respond(writer, 200, b'{"id": "chatcmpl-up", "choices": [')
        elif behaviour == "stall":
            await reader.read(1)  # say nothing until the gateway hangs up
            return False
        elif behaviour == "role-then-reset":  # a first chunk with only the role, then gone
            await start_stream(writer)
            # as transformers serve and llama.cpp send it: a fingerprint, a role, no text yet
            first = orjson.loads(chunk({"role": "assistant", "content": ""}).removeprefix(b"data: "))
            await send_chunk(
                writer, b"data: " + orjson.dumps({**first, "system_fingerprint": "fp-1"}) + b"\n\n"
            )
            writer.transport.abort()
            return False
        elif behaviour in ("reset", "stall-mid"):
            await start_stream(writer)
            await send_chunk(writer, STREAM[0])
            if behaviour == "reset":
                writer.transport.abort()
                return False
            await reader.read(1)  # silence until the gateway hangs up
            return False
        elif stream:
            pause = int(behaviour.removeprefix("drip-")) / 1000 if behaviour.startswith("drip-") else 0
            await start_stream(writer)
            for piece in STREAM:
                if pause:
                    await asyncio.sleep(pause)
                await send_chunk(writer, piece)
            if behaviour == "late-end":
                await asyncio.sleep(0.05)
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        else:
            await respond(writer, 200, orjson.dumps(COMPLETION))
        return True


def error_body(message: str) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": "upstream", "param": None, "code": None}})


async def respond(
    writer: asyncio.StreamWriter, status: int, body: bytes, headers: dict | None = None
) -> None:
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    writer.write(
        f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
        f"{extra}\r\n".encode()
        + body
    )
    await writer.drain()


async def start_stream(writer: asyncio.StreamWriter) -> None:
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
    await writer.drain()


async def send_chunk(writer: asyncio.StreamWriter, piece: bytes) -> None:
    writer.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
    await writer.drain()
