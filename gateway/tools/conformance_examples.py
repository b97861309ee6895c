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


def header_items(headers: Any) -> list[tuple[str, str]]:
    items = []
    for name, value in dict(headers or {}).items():
        for one in value if isinstance(value, list) else [value]:
            items.append((str(name), str(one)))
    return items


def shown_body(body: bytes, room: int) -> str:
    """A request body as one printable shell word of at most about `room` characters: JSON
    re-written in ASCII, anything else as bash's $'...' with its bytes escaped. A longer one is
    cut, and says so (then it is an example, no longer a reproduction)."""
    try:
        text = json.dumps(orjson.loads(body), ensure_ascii=True, separators=(",", ":"))
        binary = False
    except orjson.JSONDecodeError:
        text = "".join(chr(b) if 32 <= b < 127 and b not in b"'\\" else f"\\x{b:02x}" for b in body)
        binary = True
    if len(text) > room:
        text = text[: max(room - 40, 0)] + f"...(cut: {len(text)} chars)"
    return f"$'{text}'" if binary else shlex.quote(text)


def short_curl(request: Any, secrets: frozenset[str] = frozenset()) -> str:
    """One printable curl line of at most CURL_BYTES. A key header the run was given (its value
    in `secrets`) shows as $CHATGATE_KEY, never itself; one schemathesis made up (an invalid
    key, to see it refused) is shown as sent."""
    parts = ["curl", "-X", request.method, shlex.quote(request.uri)]
    for name, value in header_items(request.headers):
        lowered = name.lower()
        if lowered in KEY_HEADERS and value in secrets:
            hidden = "Bearer $CHATGATE_KEY" if value.lower().startswith("bearer ") else "$CHATGATE_KEY"
            parts += ["-H", f'"{name}: {hidden}"']
        elif lowered not in SCHEMATHESIS_HEADERS:
            parts += ["-H", shlex.quote(printable(f"{name}: {value}", 200))]
    line = " ".join(parts)
    if request.body:
        line += " --data-binary " + shown_body(request.body, CURL_BYTES - len(line) - 24)
    return line


SCHEMATHESIS_HEADERS = frozenset(  # sent by any client: left out of a reproduction
    {"user-agent", "accept", "accept-encoding", "connection", "content-length", "host"}
    | {"x-schemathesis-testcaseid"}
)


def record_failure(
    result: OperationResult, name: str, info: Any, interaction: Any, secrets: frozenset[str] = frozenset()
) -> None:
    """Count one failing case of check `name`; keep the shortest example of each check
    (`secrets`: the values of the key headers the run was given, never shown)."""
    failure = info.failure
    finding = result.findings.setdefault(name, Finding(name, result.label, failure.title))
    finding.count += 1
    if interaction is not None:
        curl = short_curl(interaction.request, secrets)
    else:
        curl = printable(" ".join(info.code_sample.split()), CURL_BYTES)
    if finding.curl and len(curl) >= len(finding.curl):
        return
    finding.title, finding.message, finding.curl = failure.title, str(failure.message or ""), curl
    response = interaction.response if interaction is not None else None
    finding.status = response.status_code if response is not None else None
    content = response.content if response is not None else b""
    finding.body = printable(content.decode("utf-8", "replace"), BODY_CHARS) if content else ""
