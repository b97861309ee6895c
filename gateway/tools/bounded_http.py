"""The tools' reads of a server they test (`chatgate probe`, `chatgate conformance`), bounded in
bytes and in time: a hostile or broken server cannot grow the tool past `limit` bytes of an
answer, nor hold it past `seconds` (httpx's own timeout is per read: a server dripping a byte a
second never trips it)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

DOCUMENT_BYTES = 16 * 1024 * 1024  # OpenAI's whole document is 3 MB
ANSWER_BYTES = 1024 * 1024


class Unread(httpx.HTTPError):
    """The answer was larger than the tool reads, or took longer than it waits."""


@dataclass(frozen=True, slots=True)
class Read:
    status_code: int
    content: bytes

    def json(self) -> Any:
        return orjson.loads(self.content)


def bounded(method: str, url: str, *, seconds: float, limit: int = ANSWER_BYTES, **options: Any) -> Read:
    """The answer to one request: its status and at most `limit` bytes of body, all within
    `seconds`; Unread (an httpx.HTTPError) past either."""
    ends = time.monotonic() + seconds
    with (
        httpx.Client(timeout=seconds) as client,
        client.stream(method, url, **options) as response,
    ):
        body = bytearray()
        for chunk in response.iter_bytes():  # decoded: a gzip answer is counted as it unpacks
            body += chunk
            if len(body) > limit:
                raise Unread(f"{url}: its answer is larger than {limit} bytes")
            if time.monotonic() > ends:
                raise Unread(f"{url}: no whole answer within {seconds:g} s")
        return Read(response.status_code, bytes(body))


# ----- schemathesis' own reads ------------------------------------------------------------------

FUZZED_ANSWER_BYTES = 8 * 1024 * 1024  # one answer to a fuzzed request: far past any real one
FUZZED_ANSWER_SECONDS = 30.0  # for its whole body, where the request names no timeout


def bound_schemathesis_reads(limit: int = FUZZED_ANSWER_BYTES) -> None:
    """Make schemathesis read at most `limit` bytes of an answer that is not an event stream, and
    all of it within the request's timeout (it reads a whole body into memory, however large and
    however slow; its streams it bounds itself). Its sessions are made from two classes of
    `schemathesis.transport.requests`, looked up when each is made: each is replaced by a
    subclass whose `send` reads the body itself, and answers one past the bounds with requests'
    ContentDecodingError (a failed request in the report)."""
    from schemathesis.transport import requests as transport

    for name in ("SameHostRedirectsSession", "ManagedCookiesSession"):
        base = getattr(transport, name)
        if not getattr(base, "chatgate_bounded", False):
            bounded_class = type(name, (BoundedReads, base), {"chatgate_bounded": True, "limit": limit})
            setattr(transport, name, bounded_class)


class BoundedReads:
    """A requests.Session's `send`, reading a streamed answer's body itself, within bounds."""

    limit = FUZZED_ANSWER_BYTES

    def send(self, request: Any, **kwargs: Any) -> Any:
        import requests

        streamed = kwargs.get("stream", False)
        response = super().send(request, **{**kwargs, "stream": True})  # type: ignore[misc]
        if streamed and "text/event-stream" in response.headers.get("content-type", ""):
            return response  # schemathesis reads a stream itself, bounded in time
        timeout = kwargs.get("timeout")
        seconds = timeout if isinstance(timeout, int | float) else FUZZED_ANSWER_SECONDS
        ends = time.monotonic() + seconds
        body = bytearray()
        while chunk := response.raw.read1(64 * 1024, decode_content=True):
            body += chunk
            if len(body) > self.limit or time.monotonic() > ends:
                response.close()
                why = f"larger than {self.limit} bytes" if len(body) > self.limit else ""
                why = why or f"not whole in {seconds:g} s"
                raise requests.exceptions.ContentDecodingError(
                    f"the answer is {why} (chatgate conformance reads no more)"
                )
        response._content = bytes(body)
        response._content_consumed = True
        return response
