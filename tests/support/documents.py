"""Check a response against what a dialect's own document says for that operation and status,
fields it does not define included."""

from __future__ import annotations

from functools import cache
from typing import Any

import jsonschema_rs

from gateway.http.documents import load_document, resolve
from gateway.http.validation import to_json_schema


def closed(schema: Any) -> Any:
    """The schema with every object that lists its properties closed to others
    (`additionalProperties: false` where it says nothing): an answer may carry only the fields its
    document defines. The documents never close their own answers, to keep clients lenient; the
    gateway's answers are held to them here."""
    if isinstance(schema, list):
        return [closed(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    tightened = {key: closed(value) for key, value in schema.items()}
    if "properties" in schema and "additionalProperties" not in schema:
        tightened["additionalProperties"] = False
    return tightened


@cache
def document(spec_file: str) -> dict[str, Any]:
    """The document as JSON Schema, its answers' objects closed (see `closed`)."""
    return closed(to_json_schema(load_document(spec_file)))


def operation(spec_file: str, path: str, method: str) -> dict[str, Any]:
    return document(spec_file)["paths"][path][method]


def response_errors(
    spec_file: str, path: str, method: str, status: int, body: Any, media_type: str = "application/json"
) -> list[str]:
    """Messages for every way `body` breaks the documented response; [] when it conforms."""
    validator = response_validator(spec_file, path, method, status, media_type)
    if validator is None:
        return [f"status {status} is not documented for {method.upper()} {path}"]
    return [f"{list(e.instance_path)}: {e.message}" for e in validator.iter_errors(body)]


def documented_headers(spec_file: str, path: str, method: str, status: int) -> dict[str, dict[str, Any]]:
    """The headers a response is documented with: lower-cased name → its schema (read from the
    document as written: its JSON Schema form drops every `x-` key, header names included)."""
    root = load_document(spec_file)
    documented = resolve(root, root["paths"][path][method]["responses"][str(status)])
    headers = documented.get("headers", {})
    return {name.lower(): resolve(root, header)["schema"] for name, header in headers.items()}


@cache
def response_validator(
    spec_file: str, path: str, method: str, status: int, media_type: str
) -> jsonschema_rs.Draft4Validator | None:
    root = document(spec_file)
    responses = operation(spec_file, path, method)["responses"]
    documented = responses.get(str(status)) or responses.get("default")
    if documented is None:
        return None
    schema = dict(resolve(root, resolve(root, documented)["content"][media_type]["schema"]))
    schema["components"] = root["components"]
    return jsonschema_rs.Draft4Validator(schema)
