"""The floor for the spine benchmark: a bare ASGI app that answers every request with the
same chat.completion body the echo backend would give (no routing, no validation)."""

from __future__ import annotations

import orjson

BODY = orjson.dumps(
    {
        "id": "chatcmpl-0",
        "object": "chat.completion",
        "created": 0,
        "model": "echo",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "[chatgate echo backend, not a language model] You said: Hello!",
                },
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 4, "completion_tokens": 10, "total_tokens": 14},
    }
)
HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(BODY)).encode())]


async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": BODY})
