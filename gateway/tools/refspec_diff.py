"""What changed in a vendor's chat operation between two versions of its published document:
the fields of the request body and of the answer (JSON and, where described, the stream), each
with its types and enum values; a field added, removed or retyped, a value added or removed.

`scripts/fetch-refspecs --update` prints this for each vendor's newest document against the
pinned one, so that a new field is seen, and taken into openapi/, in one commit. It reads
OpenAPI 3.0/3.1 and Swagger 2.0 documents as they are (no network, no other file): `$ref`s are
followed inside the document, `allOf`/`oneOf`/`anyOf` merged into one field per path, Swagger's
polymorphism (a base with `discriminator` and its subtypes) walked as the union of the subtypes,
and the Aleph Alpha copy's strings ("true") read as what they say.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

CHAT_PATH_SUFFIX = "/chat/completions"
JSON_MEDIA = "application/json"
STREAM_MEDIA = "text/event-stream"
MAX_DEPTH = 12  # a field path deeper than this is not walked (schemas within schemas)


@dataclass
class Field:
    """One field path's types and enum values, merged over every schema that describes it."""

    types: set[str] = field(default_factory=set)
    values: set[str] | None = None  # JSON texts of the enum values; None: not an enum

    def description(self) -> str:
        kinds = ", ".join(sorted(self.types)) or "any"
        return kinds if self.values is None else f"{kinds}; enum: {', '.join(sorted(self.values))}"


@dataclass(frozen=True)
class Change:
    kind: str  # added | removed | retyped | values
    path: str  # e.g. "request.messages[].role"
    detail: str

    def line(self) -> str:
        return f"{self.kind:<8} {self.path}: {self.detail}"


class Walker:
    """Flattens the schemas of one document into {field path: Field}."""

    def __init__(self, document: dict[str, Any]) -> None:
        self.document = document
        self.schemas: dict[str, Any] = document.get("definitions") or (
            document.get("components", {}).get("schemas") or {}
        )
        self.fields: dict[str, Field] = {}

    def ref_name(self, ref: str) -> str | None:
        for prefix in ("#/components/schemas/", "#/definitions/"):
            if ref.startswith(prefix):
                return ref.removeprefix(prefix)
        return None

    def subtypes(self, name: str) -> Iterator[str]:
        """Swagger 2.0 subtypes: the definitions that extend `name` with allOf."""
        for other, schema in self.schemas.items():
            for part in schema.get("allOf") or []:
                if isinstance(part, dict) and part.get("$ref") in (
                    f"#/definitions/{name}",
                    f"#/components/schemas/{name}",
                ):
                    yield other

    def walk(self, node: Any, path: str, seen: frozenset[str] = frozenset(), depth: int = 0) -> None:
        if not isinstance(node, dict) or depth > MAX_DEPTH:
            return
        ref = node.get("$ref")
        if isinstance(ref, str):
            name = self.ref_name(ref)
            if name is None or name in seen or name not in self.schemas:
                self.fields.setdefault(path, Field())
                return
            target = self.schemas[name]
            seen = seen | {name}
            if isinstance(target, dict) and target.get("discriminator"):
                for sub in self.subtypes(name):
                    if sub not in seen:
                        self.walk(self.schemas[sub], path, seen | {sub}, depth)
            self.walk(target, path, seen, depth)
            return
        here = self.fields.setdefault(path, Field())
        kind = node.get("type")
        here.types.update([kind] if isinstance(kind, str) else [k for k in kind or [] if isinstance(k, str)])
        if node.get("nullable") in (True, "true") or node.get("x-nullable") in (True, "true"):
            here.types.add("null")
        for key in ("enum", "const"):
            if key in node:
                values = node[key] if key == "enum" and isinstance(node[key], list) else [node[key]]
                here.values = (here.values or set()) | {json.dumps(v, sort_keys=True) for v in values}
        for combinator in ("allOf", "oneOf", "anyOf"):
            for part in node.get(combinator) or []:
                self.walk(part, path, seen, depth)
        for name, schema in (node.get("properties") or {}).items():
            self.walk(schema, f"{path}.{name}", seen, depth + 1)
        if isinstance(node.get("items"), dict):
            self.walk(node["items"], f"{path}[]", seen, depth + 1)
        if isinstance(node.get("additionalProperties"), dict) and node["additionalProperties"]:
            self.walk(node["additionalProperties"], f"{path}{{}}", seen, depth + 1)


def chat_operation(document: dict[str, Any]) -> dict[str, Any]:
    """The POST operation whose path ends in /chat/completions (a ValueError when none)."""
    for path, item in (document.get("paths") or {}).items():
        if path.endswith(CHAT_PATH_SUFFIX) and isinstance(item, dict) and "post" in item:
            return item["post"]
    raise ValueError(f"the document has no POST …{CHAT_PATH_SUFFIX}")


def bodies(document: dict[str, Any]) -> dict[str, Any]:
    """The chat operation's schemas by what they are: request, response, stream."""
    operation = chat_operation(document)
    found: dict[str, Any] = {}
    for parameter in operation.get("parameters") or []:  # Swagger 2.0
        if isinstance(parameter, dict) and parameter.get("in") == "body":
            found["request"] = parameter.get("schema")
    content = (operation.get("requestBody") or {}).get("content") or {}
    if JSON_MEDIA in content:
        found["request"] = content[JSON_MEDIA].get("schema")
    answer = (operation.get("responses") or {}).get("200") or {}
    if "schema" in answer:  # Swagger 2.0
        found["response"] = answer["schema"]
    for media, where in ((JSON_MEDIA, "response"), (STREAM_MEDIA, "stream")):
        if media in (answer.get("content") or {}):
            found[where] = answer["content"][media].get("schema")
    return found


def chat_fields(document: dict[str, Any]) -> dict[str, Field]:
    """Every field path of the chat operation's request and answers, with its types and values."""
    walker = Walker(document)
    for where, schema in bodies(document).items():
        walker.walk(schema, where)
    return walker.fields


def changes(old: dict[str, Any], new: dict[str, Any]) -> list[Change]:
    """What the chat operation's fields did from the `old` document to the `new` one."""
    before, after = chat_fields(old), chat_fields(new)
    found: list[Change] = []
    for path in sorted(before.keys() | after.keys()):
        was, now = before.get(path), after.get(path)
        if was is None and now is not None:
            found.append(Change("added", path, now.description()))
        elif now is None and was is not None:
            found.append(Change("removed", path, was.description()))
        elif was is not None and now is not None:
            if was.types != now.types:
                retyped = f"{', '.join(sorted(was.types)) or 'any'} → {', '.join(sorted(now.types)) or 'any'}"
                found.append(Change("retyped", path, retyped))
            if was.values != now.values:
                gained = sorted((now.values or set()) - (was.values or set()))
                lost = sorted((was.values or set()) - (now.values or set()))
                said = [f"+ {v}" for v in gained] + [f"- {v}" for v in lost]
                if was.values is None or now.values is None:
                    said.append("now an enum" if was.values is None else "no longer an enum")
                found.append(Change("values", path, ", ".join(said)))
    return found
