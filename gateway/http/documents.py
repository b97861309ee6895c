"""The dialects' OpenAPI documents, loaded once at start, and the facts the gateway reads from them."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml

from gateway.dialects.defaults import Default, field_defaults
from gateway.dialects.rules import Rule, read_rules


def documents_dir() -> Path:
    """The dialects' documents: inside the package when installed from a wheel (it ships them as
    gateway/openapi/), else openapi/ at the top of the source checkout, their one true home."""
    package = Path(__file__).resolve().parents[1]
    installed = package / "openapi"
    return installed if installed.is_dir() else package.parent / "openapi"


SPEC_DIR = documents_dir()
# the operations a path item may hold (OpenAPI 3.0)
HTTP_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")


# libyaml's loader where PyYAML was built with it: a tenth of the pure-Python loader's time
SAFE_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@functools.cache
def load_document(file_name: str) -> dict[str, Any]:
    """A dialect's document, parsed once per process (the translators' facts, the front door's
    tables and Connexion all read it). Shared: whoever must change it changes a copy."""
    with (SPEC_DIR / file_name).open(encoding="utf-8") as handle:
        return yaml.load(handle, Loader=SAFE_LOADER)


def resolve(document: dict[str, Any], node: Any) -> Any:
    """`node`, its local `$ref`s followed within `document`."""
    while isinstance(node, dict) and "$ref" in node:
        target: Any = document
        for part in node["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        node = target
    return node


@dataclass
class DialectSpec:
    """One dialect's document and what the policy layer needs from it."""

    document: dict[str, Any]
    chat_operation_ids: frozenset[str]

    def resolve(self, node: Any) -> Any:
        return resolve(self.document, node)

    def operations(self) -> dict[str, dict[str, Any]]:
        found = {}
        for item in self.document.get("paths", {}).values():
            for method in HTTP_METHODS:
                if method in item:
                    found[item[method]["operationId"]] = item[method]
        return found

    def request_schema(self, operation_id: str) -> dict[str, Any]:
        operation = self.operations()[operation_id]
        body = self.resolve(operation.get("requestBody", {}))
        return self.resolve(body.get("content", {}).get("application/json", {}).get("schema", {}))

    def properties(self, schema: dict[str, Any]) -> dict[str, Any]:
        """Top-level properties of a schema, following $ref and allOf."""
        schema = self.resolve(schema)
        found = dict(schema.get("properties", {}))
        for part in schema.get("allOf", []):
            found.update(self.properties(part))
        return found

    @cached_property
    def chat_properties(self) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for operation_id in self.chat_operation_ids:
            found.update(self.properties(self.request_schema(operation_id)))
        return found

    @cached_property
    def chat_fields(self) -> frozenset[str]:
        """The parameters the dialect defines; anything else is an extra parameter."""
        return frozenset(self.chat_properties)

    @cached_property
    def unsupported(self) -> dict[str, str]:
        """Parameters the dialect's document marks `x-chatgate-unsupported` (ignored | rejected)."""
        return {
            name: self.resolve(schema)["x-chatgate-unsupported"]
            for name, schema in self.chat_properties.items()
            if "x-chatgate-unsupported" in self.resolve(schema)
        }

    @cached_property
    def defaults(self) -> dict[str, Default]:
        """The chat body's fields that declare a default, themselves or in their members."""
        return field_defaults(self.chat_properties, self.resolve)

    @cached_property
    def rules(self) -> tuple[Rule, ...]:
        """The cross-field rules the chat request schemas state in `x-chatgate-rules`."""
        defaults = {
            name: self.resolve(schema)["default"]
            for name, schema in self.chat_properties.items()
            if "default" in self.resolve(schema)
        }
        found: dict[str, Rule] = {}
        for operation_id in sorted(self.chat_operation_ids):
            for rule in read_rules(self.request_schema(operation_id), defaults):
                found.setdefault(rule.name, rule)
        return tuple(found.values())
