"""Load a dialect's document for schemathesis so that it checks stream payloads, not just frames.

OpenAPI 3.0 cannot say "this SSE event's `data` is JSON of schema X", so our documents
write it as the extensions `x-contentMediaType` / `x-contentSchema` (the JSON Schema
2019+ keywords, which OpenAPI 3.2 and schemathesis understand). For schemathesis they are
renamed to the real keywords, and each JSON-lines stream is read as an array of chunks.
"""

from __future__ import annotations

import copy
from typing import Any

import orjson

EXTENSION_KEYWORDS = {"x-contentMediaType": "contentMediaType", "x-contentSchema": "contentSchema"}
JSON_LINES = "application/jsonlines"


def with_content_keywords(node: Any) -> Any:
    if isinstance(node, list):
        return [with_content_keywords(item) for item in node]
    if isinstance(node, dict):
        return {EXTENSION_KEYWORDS.get(k, k): with_content_keywords(v) for k, v in node.items()}
    return node


def for_schemathesis(document: dict[str, Any], mount: str) -> dict[str, Any]:
    """The document as schemathesis should read it, served at `mount`."""
    document = with_content_keywords(copy.deepcopy(document))
    document["servers"] = [{"url": mount or "/"}]
    for item in document.get("paths", {}).values():
        for operation in item.values():
            if not isinstance(operation, dict):
                continue
            for response in operation.get("responses", {}).values():
                media = response.get("content", {}).get(JSON_LINES)
                if media and "schema" in media:
                    media["schema"] = {"type": "array", "items": media["schema"]}
    return document


def register_json_lines() -> None:
    """Teach schemathesis to read an `application/jsonlines` body as a list of JSON values."""
    import schemathesis

    @schemathesis.deserializer(JSON_LINES)
    def read_json_lines(_context: Any, response: Any) -> list[Any]:
        return [orjson.loads(line) for line in response.content.splitlines() if line.strip()]
