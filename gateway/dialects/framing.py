"""Stream framings: how a streamed answer's payloads become bytes on the wire. Server-sent events
with `data:` lines only (OpenAI-style, ending `[DONE]`), server-sent events named by each
payload's `type` (`event: <type>`, as Anthropic's Messages and OpenAI's Responses streams have
them), and JSON lines (LMI). A dialect's translator names one (`Translator.framing`)."""

from __future__ import annotations

from typing import Any, Protocol

import orjson


class Framing(Protocol):
    """What the chat flow (gateway/chat.py) writes a stream with."""

    @property
    def media_type(self) -> str: ...
    @property
    def done(self) -> bytes | None:
        """What ends a stream that ended well (None: nothing, the end of the body says it)."""

    @property
    def keepalive(self) -> bytes | None:
        """What keeps a quiet stream alive for proxies (None: the framing has nothing clients skip)."""

    def frame(self, payload: Any, /) -> bytes:
        """One payload, framed."""

    def error(self, payload: Any, /) -> bytes:
        """An error payload after the 200 went out, framed so that the dialect's clients raise it."""


class SSE:
    """Server-sent events as OpenAI writes them: a `data:` line each, `[DONE]` last."""

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


class NamedEventSSE:
    """Server-sent events each named by its payload's `type` (`event: message_start`, `event:
    response.output_text.delta`, …), with no end marker: the last named event ends the stream.
    An error is a payload like any other (its `type` is the event's name, `error`)."""

    media_type = "text/event-stream"
    done: bytes | None = None
    keepalive: bytes | None = b"\n"  # an empty line dispatches nothing (see SSE)

    @staticmethod
    def frame(payload: Any) -> bytes:
        return b"event: " + payload["type"].encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"

    error = frame


class JSONLines:
    media_type = "application/jsonlines"
    done: bytes | None = None
    keepalive: bytes | None = None  # JSON lines has no comment syntax

    @staticmethod
    def frame(payload: Any) -> bytes:
        return orjson.dumps(payload) + b"\n"

    error = frame
