"""A stand-in OpenAI-compatible server that deviates as real ones do: it ignores `n`, logprobs,
tools and response_format (answering one plain choice, as transformers serve does), keeps the
stop string in its text, honours max_tokens and seed (it is deterministic), ends a stream
without [DONE] and without a usage chunk, and answers errors as {"detail": ...} (FastAPI's
shape, not OpenAI's). With `key`, every request must carry it as a Bearer token (else a 401, or
`unauthorized_status`).

It echoes the last user message, so what it honours is plain to see. It answers every
dialect's chat path (`url_of(dialect)` is that dialect's base URL) the same OpenAI way: so, in
LMI's place, a stream framed as SSE where LMI's are JSON lines, and everywhere errors in none
of the dialects' shapes."""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from tests.support.servers import free_port

# dialect → (its base path, its chat path below it): where the stand-in answers as that dialect
DIALECT_PATHS = {
    "openai": ("/v1", "/chat/completions"),
    "azure": ("/azure", "/chat/completions"),
    "aleph_alpha": ("/aleph-alpha", "/chat/completions"),
    "lmi": ("/lmi", "/v1/chat/completions"),
    "ovms": ("/v3", "/chat/completions"),
}


class DeviatingUpstream:
    def __init__(
        self, key: str | None = None, unauthorized_status: int = 401, pinned_model: str | None = None
    ) -> None:
        self.key = key
        self.pinned_model = pinned_model  # any other model is refused, as transformers serve does
        self.unauthorized_status = unauthorized_status  # LiteLLM's proxy answers 500
        self.url = ""
        self.bodies: list[dict[str, Any]] = []  # every chat request, as received
        self.header_names: set[str] = set()  # of every chat request

    def app(self) -> Starlette:
        paths = [base + chat for base, chat in DIALECT_PATHS.values()]
        return Starlette(routes=[Route(path, self.chat, methods=["POST"]) for path in paths])

    def url_of(self, dialect: str) -> str:
        """The base URL the stand-in answers `dialect` at (`url` is OpenAI's)."""
        return self.url.removesuffix("/v1") + DIALECT_PATHS[dialect][0]

    async def chat(self, request: Request) -> Response:
        self.header_names.update(request.headers.keys())
        if self.key is not None and request.headers.get("authorization") != f"Bearer {self.key}":
            # as real servers do, it quotes the key it was given (OpenAI: "Incorrect API key provided")
            presented = request.headers.get("authorization", "").removeprefix("Bearer ")
            return detail(self.unauthorized_status, f"Incorrect API key provided: {presented}")
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError:
            return detail(422, "the body is not JSON")
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return detail(422, "messages: Input should be a valid list")
        self.bodies.append(body)
        if self.pinned_model is not None and body.get("model") != self.pinned_model:
            return detail(400, f"Server is pinned to {self.pinned_model!r}; requested {body.get('model')!r}.")
        words, finish = answer(body)
        if body.get("stream"):
            return StreamingResponse(chunks(words, finish), media_type="text/event-stream")
        completion = {
            "id": "chatcmpl-deviating",
            "object": "chat.completion",
            "created": 0,
            "model": body.get("model"),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": " ".join(words)},
                    "logprobs": None,
                    "finish_reason": finish,
                }
            ],
            "usage": {"prompt_tokens": 8, "completion_tokens": len(words), "total_tokens": 8 + len(words)},
        }
        return Response(orjson.dumps(completion), media_type="application/json")


def detail(status: int, message: str) -> Response:
    return Response(orjson.dumps({"detail": message}), status_code=status, media_type="application/json")


def answer(body: dict[str, Any]) -> tuple[list[str], str]:
    """The last user message's words, up to and with a stop string, at most max_tokens of them."""
    said = ""
    for message in body["messages"]:
        if isinstance(message, dict) and message.get("role") == "user":
            said = message.get("content") if isinstance(message.get("content"), str) else ""
    stops = body.get("stop") or []
    stops = [stops] if isinstance(stops, str) else stops
    finish = "stop"
    for stop in stops:
        at = said.find(stop)
        if at >= 0:
            said = said[: at + len(stop)]  # kept, as TGI's and some servers' defaults do
    words = said.split()
    limit = body.get("max_tokens")
    if isinstance(limit, int) and len(words) > limit:
        words, finish = words[:limit], "length"
    return words, finish


async def chunks(words: list[str], finish: str) -> AsyncIterator[bytes]:
    for position, word in enumerate(words):
        delta = {"content": (" " if position else "") + word}
        yield sse({"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta}]})
    ending = {"index": 0, "delta": {}, "finish_reason": finish}
    yield sse({"id": "c", "object": "chat.completion.chunk", "choices": [ending]})


def sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


@contextmanager
def running_deviating_upstream(
    key: str | None = None, port: int = 0, unauthorized_status: int = 401, pinned_model: str | None = None
) -> Iterator[DeviatingUpstream]:
    """The stand-in served by uvicorn on a loopback port (0: a free one), in a thread of this
    process; its base URL (…/v1) in `url`."""
    stand_in = DeviatingUpstream(key, unauthorized_status, pinned_model)
    port = port or free_port()
    config = uvicorn.Config(
        stand_in.app(), host="127.0.0.1", port=port, log_level="critical", lifespan="off", loop="asyncio"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="deviating-upstream", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the deviating stand-in did not start")
        time.sleep(0.02)
    stand_in.url = f"http://127.0.0.1:{port}/v1"
    try:
        yield stand_in
    finally:
        server.should_exit = True
        thread.join(timeout=10)
