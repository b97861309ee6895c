"""A relay on a loopback port in front of a gateway. It keeps every POST's JSON body and the
answer it gave back, so a test can read what a client sent (an agent's second turn, the tool's
output in it) and what it was told, while the gateway answers as usual. It reads each request
whole, sends it on with httpx and gives the answer back whole (a stream arrives at once, still a
stream: the client reads it the same way), one request a connection."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import httpx

from tests.support.loopback_server import LoopbackServer, read_request


@dataclass(frozen=True)
class Exchange:
    path: str
    body: dict[str, Any]  # the request's JSON
    status: int
    answer: bytes  # the answer's body as the client got it

    def events(self) -> list[dict[str, Any]]:
        """The answer's server-sent events, if it was a stream: each `data:` line's JSON."""
        lines = self.answer.decode().splitlines()
        data = [line.removeprefix("data:").strip() for line in lines if line.startswith("data:")]
        return [json.loads(payload) for payload in data if payload != "[DONE]"]


# hop-by-hop or recomputed here: not relayed
DROPPED_HEADERS = frozenset({"host", "connection", "content-length", "transfer-encoding", "keep-alive"})


class RecordingRelay(LoopbackServer):
    thread_name = "recording-relay"

    def __init__(self, target: str) -> None:
        super().__init__()
        self.target = target.rstrip("/")
        self.exchanges: list[Exchange] = []  # every POST, in the order they came

    def posted(self, path_end: str) -> list[Exchange]:
        return [e for e in self.exchanges if e.path.split("?")[0].endswith(path_end)]

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        try:
            method, target, headers, body = await read_request(reader)
            sent = {k: v for k, v in headers.items() if k not in DROPPED_HEADERS}
            async with httpx.AsyncClient(timeout=120) as client:
                answer = await client.request(method, self.target + target, headers=sent, content=body)
            if method == "POST":
                self.exchanges.append(Exchange(target, json.loads(body), answer.status_code, answer.content))
            kept = [(k, v) for k, v in answer.headers.items() if k.lower() not in DROPPED_HEADERS]
            kept = [(k, v) for k, v in kept if k.lower() != "content-encoding"]  # httpx decoded it
            head = [f"HTTP/1.1 {answer.status_code} {answer.reason_phrase}"]
            head += [f"{k}: {v}" for k, v in kept]
            head += [f"content-length: {len(answer.content)}", "connection: close", "", ""]
            writer.write("\r\n".join(head).encode("latin-1") + answer.content)
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            self.tasks.discard(task)
