"""What an upstream's answer bodies say, read without a client: a message's content as text, and
the message of an error body in any of the common shapes. Kept apart from the client so that
reading an answer (the probes' judges do) needs no HTTP library."""

from __future__ import annotations

from typing import Any

import orjson

MESSAGE_LIMIT = 1000


def snippet(raw: bytes, limit: int = 200) -> str:
    return raw[:limit].decode("utf-8", "replace")


def content_text(content: Any) -> str:
    """Message content as text (a list of parts is joined by its text parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.get("text") or "" for part in content if isinstance(part, dict))


def error_message(raw: bytes) -> tuple[str, str | None]:
    """The message (and offending parameter) in an upstream error body of any common shape."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return (snippet(raw, MESSAGE_LIMIT).strip() or "(empty response)"), None
    if not isinstance(body, dict):
        return snippet(raw, MESSAGE_LIMIT), None
    error = body.get("error")
    if isinstance(error, dict):  # OpenAI, vLLM, chatgate
        message, param = error.get("message"), error.get("param")
    else:  # OVMS / Aleph Alpha {"error": "..."}, Azure {"error", "message"}, LMI {"message"}
        message = body.get("message") or error or body.get("detail")
        param = body.get("param")
    if not isinstance(message, str):
        message = orjson.dumps(message).decode() if message is not None else snippet(raw)
    return message[:MESSAGE_LIMIT], param if isinstance(param, str) else None
