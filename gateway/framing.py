"""Stream framings: server-sent events (OpenAI-style, ending `[DONE]`) and JSON lines (LMI)."""

from __future__ import annotations

from typing import Any

import orjson


class SSE:
    media_type = "text/event-stream"
    done: bytes | None = b"data: [DONE]\n\n"
    # a comment line: clients ignore it, proxies with idle timeouts see traffic
    keepalive: bytes | None = b": keep-alive\n\n"

    @staticmethod
    def frame(payload: Any) -> bytes:
        return b"data: " + orjson.dumps(payload) + b"\n\n"


class JSONLines:
    media_type = "application/jsonlines"
    done: bytes | None = None
    keepalive: bytes | None = None  # JSON lines has no comment syntax

    @staticmethod
    def frame(payload: Any) -> bytes:
        return orjson.dumps(payload) + b"\n"


Framing = type[SSE] | type[JSONLines]
