"""Stream framings: server-sent events (OpenAI-style, ending `[DONE]`) and JSON lines (LMI)."""

from __future__ import annotations

from typing import Any

import orjson


class SSE:
    media_type = "text/event-stream"
    done: bytes | None = b"data: [DONE]\n\n"
    # An empty line: between events it dispatches nothing, and every client skips it, while
    # proxies with idle timeouts see traffic. Not a comment (`: keep-alive`): the Azure and
    # Aleph Alpha SDKs raise on any line that is not `data:`.
    keepalive: bytes | None = b"\n"

    @staticmethod
    def frame(payload: Any) -> bytes:
        return b"data: " + orjson.dumps(payload) + b"\n\n"

    @staticmethod
    def error(payload: Any) -> bytes:
        """An error after the 200 went out, as an `error` event: the OpenAI SDK raises it with
        its message; the Azure and Aleph Alpha SDKs, which would skip a `data:` line without
        choices or fail on it with KeyError, raise on the event line."""
        return b"event: error\ndata: " + orjson.dumps(payload) + b"\n\n"


class JSONLines:
    media_type = "application/jsonlines"
    done: bytes | None = None
    keepalive: bytes | None = None  # JSON lines has no comment syntax

    @staticmethod
    def frame(payload: Any) -> bytes:
        return orjson.dumps(payload) + b"\n"

    error = frame


Framing = type[SSE] | type[JSONLines]
