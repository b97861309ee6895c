"""An OpenAI-compatible stand-in that either honours `n` or ignores it, as real servers do.

`/honours/v1/chat/completions` answers `n` choices (vLLM, SGLang, OpenAI): a whole completion
with each, or a stream whose chunks interleave them. `/ignores/v1/chat/completions` answers one
choice whatever `n` says (Hugging Face `transformers serve`, llama.cpp's server); `/stalls/v1/…`
streams one chunk of one choice, then says no more until the gateway hangs up. Every answer's
text names the request it answers (`reply <k>`, k counting from 1) and its choice; usage is
PROMPT_TOKENS for the prompt and COMPLETION_TOKENS per choice. The bodies received are kept.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from tests.support.loopback_server import LoopbackServer, read_request

PROMPT_TOKENS = 7
COMPLETION_TOKENS = 2  # per choice
PIECES = ("reply", " {k}", " choice", " {i}")  # a choice's text, streamed piece by piece


def choice_text(k: int, i: int) -> str:
    return "".join(PIECES).format(k=k, i=i)


class ChoicesUpstream(LoopbackServer):
    thread_name = "choices-upstream"

    def __init__(self) -> None:
        super().__init__()
        self.received: list[tuple[str, dict[str, Any]]] = []  # (behaviour, body) per request
        self.hung_up = 0  # stalled answers the gateway hung up on

    def base_url(self, behaviour: str) -> str:
        return f"{self.url}/{behaviour}/v1"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        try:
            _method, target, _headers, raw = await read_request(reader)
            behaviour = target.strip("/").split("/")[0]
            body = orjson.loads(raw)
            self.received.append((behaviour, body))
            k = len(self.received)
            n = (body.get("n") or 1) if behaviour == "honours" else 1
            if behaviour == "stalls":
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n")
                writer.write(chunk(k, [{"index": 0, "delta": {"content": "reply"}, "finish_reason": None}]))
                await writer.drain()
                await reader.read()  # returns when the gateway closes the connection
                self.hung_up += 1
            elif body.get("stream"):
                await self.stream(writer, k, n, bool((body.get("stream_options") or {}).get("include_usage")))
            else:
                await self.whole(writer, k, n)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            self.tasks.discard(task)

    @staticmethod
    async def whole(writer: asyncio.StreamWriter, k: int, n: int) -> None:
        choices = [
            {"index": i, "message": {"role": "assistant", "content": choice_text(k, i)},
             "logprobs": None, "finish_reason": "stop"}
            for i in range(n)
        ]  # fmt: skip
        completion = {"id": f"up-{k}", "object": "chat.completion", "created": 0, "model": "up",
                      "choices": choices, "usage": usage(n)}  # fmt: skip
        body = orjson.dumps(completion)
        head = f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
        writer.write((head + "connection: close\r\n\r\n").encode() + body)
        await writer.drain()

    @staticmethod
    async def stream(writer: asyncio.StreamWriter, k: int, n: int, include_usage: bool) -> None:
        """Each piece of every choice in turn: choice 0's first piece, choice 1's first piece …"""
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n")
        for position, piece in enumerate(PIECES):
            for i in range(n):
                delta: dict[str, Any] = {"content": piece.format(k=k, i=i)}
                if position == 0:
                    delta["role"] = "assistant"
                writer.write(chunk(k, [{"index": i, "delta": delta, "finish_reason": None}]))
            await writer.drain()
        writer.write(chunk(k, [{"index": i, "delta": {}, "finish_reason": "stop"} for i in range(n)]))
        if include_usage:
            writer.write(chunk(k, [], usage=usage(n)))
        writer.write(b"data: [DONE]\n\n")
        await writer.drain()


def usage(n: int) -> dict[str, int]:
    completion = COMPLETION_TOKENS * n
    return {
        "prompt_tokens": PROMPT_TOKENS,
        "completion_tokens": completion,
        "total_tokens": PROMPT_TOKENS + completion,
    }


def chunk(k: int, choices: list[dict[str, Any]], **extra: Any) -> bytes:
    body = {"id": f"up-{k}", "object": "chat.completion.chunk", "created": 0, "model": "up",
            "choices": choices, **extra}  # fmt: skip
    return b"data: " + orjson.dumps(body) + b"\n\n"
