"""The example of a conformance finding: the shortest failing case as one printable `curl` of
at most CURL_BYTES (the key as $CHATGATE_KEY, never itself), with its status and a bounded
answer; and the count of the cases that failed the check."""

from __future__ import annotations

import json
import shlex
from typing import Any

import orjson

from gateway.tools.conformance_report import BODY_CHARS, CURL_BYTES, Finding, OperationResult, printable

KEY_HEADERS = frozenset({"authorization", "api-key", "x-api-key"})
SHOWN_HEADERS = frozenset({"content-type", "extra-parameters"})


def header_items(headers: Any) -> list[tuple[str, str]]:
    items = []
    for name, value in dict(headers or {}).items():
        for one in value if isinstance(value, list) else [value]:
            items.append((str(name), str(one)))
    return items


def shown_body(body: bytes | None) -> str:
    """A request body as a printable shell word: JSON re-written in ASCII, anything else as
    bash's $'...' with its bytes escaped."""
    if not body:
        return ""
    try:
        text = json.dumps(orjson.loads(body), ensure_ascii=True, separators=(",", ":"))
    except orjson.JSONDecodeError:
        plain = (chr(b) if 32 <= b < 127 and b not in b"'\\" else f"\\x{b:02x}" for b in body)
        return "$'" + "".join(plain) + "'"
    return shlex.quote(text)


def short_curl(request: Any) -> str:
    """One printable curl line of at most CURL_BYTES: the key as $CHATGATE_KEY, never itself;
    a body too long for that is cut, and the line says so."""
    parts = ["curl", "-X", request.method, shlex.quote(request.uri)]
    for name, value in header_items(request.headers):
        lowered = name.lower()
        if lowered in KEY_HEADERS:
            secret = "Bearer $CHATGATE_KEY" if lowered == "authorization" else "$CHATGATE_KEY"
            parts += ["-H", f'"{name}: {secret}"']
        elif lowered in SHOWN_HEADERS or lowered not in SCHEMATHESIS_HEADERS:
            parts += ["-H", shlex.quote(printable(f"{name}: {value}", 200))]
    body = shown_body(request.body)
    line = " ".join(parts)
    if body:
        room = CURL_BYTES - len(line) - 16
        if len(body) > room:
            body = body[: max(room - 40, 0)] + f"...(cut: {len(body)} chars)"
        line += " --data-binary " + body
    return line


SCHEMATHESIS_HEADERS = frozenset(  # sent by any client: left out of a reproduction
    {"user-agent", "accept", "accept-encoding", "connection", "content-length", "host"}
    | {"x-schemathesis-testcaseid"}
)


def record_failure(result: OperationResult, name: str, info: Any, interaction: Any) -> None:
    """Count one failing case of check `name`; keep the shortest example of each check."""
    failure = info.failure
    finding = result.findings.setdefault(name, Finding(name, result.label, failure.title))
    finding.count += 1
    if interaction is not None:
        curl = short_curl(interaction.request)
    else:
        curl = printable(" ".join(info.code_sample.split()), CURL_BYTES)
    if finding.curl and len(curl) >= len(finding.curl):
        return
    finding.title, finding.message, finding.curl = failure.title, str(failure.message or ""), curl
    response = interaction.response if interaction is not None else None
    finding.status = response.status_code if response is not None else None
    content = response.content if response is not None else b""
    finding.body = printable(content.decode("utf-8", "replace"), BODY_CHARS) if content else ""
