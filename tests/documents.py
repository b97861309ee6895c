"""Check a response against what a dialect's own document says for that operation and status."""

from __future__ import annotations

from functools import cache
from typing import Any

import jsonschema_rs

from gateway.spec import load_document, resolve
from gateway.validation import to_json_schema


@cache
def document(spec_file: str) -> dict[str, Any]:
    return to_json_schema(load_document(spec_file))


def operation(spec_file: str, path: str, method: str) -> dict[str, Any]:
    return document(spec_file)["paths"][path][method]


def response_errors(
    spec_file: str, path: str, method: str, status: int, body: Any, media_type: str = "application/json"
) -> list[str]:
    """Messages for every way `body` breaks the documented response; [] when it conforms."""
    root = document(spec_file)
    responses = operation(spec_file, path, method)["responses"]
    documented = responses.get(str(status)) or responses.get("default")
    if documented is None:
        return [f"status {status} is not documented for {method.upper()} {path}"]
    schema = dict(resolve(root, resolve(root, documented)["content"][media_type]["schema"]))
    schema["components"] = root["components"]
    validator = jsonschema_rs.Draft4Validator(schema)
    return [f"{list(e.instance_path)}: {e.message}" for e in validator.iter_errors(body)]
