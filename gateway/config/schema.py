"""The config file's JSON Schema, generated from the settings models (`chatgate config schema`;
committed as docs/config.schema.json for editors that complete YAML from a schema).

Settings types a deployment's `options:` as a free mapping, because which model applies depends
on its `backend:`; the schema spells that out with one if/then per backend kind, from the
backend's own options model (required keys dropped: a replica may give them instead).
"""

from __future__ import annotations

from typing import Any

from backends.base import BACKEND_KINDS
from gateway.config.settings import Settings

SCHEMA_ID = "https://github.com/chatgate/chatgate/docs/config.schema.json"


def without_required(schema: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in schema.items() if k != "required"}


def config_json_schema() -> dict[str, Any]:
    schema = Settings.model_json_schema(mode="validation")
    definitions = schema.setdefault("$defs", {})
    deployment = definitions["Deployment"]
    deployment["properties"]["backend"]["enum"] = list(BACKEND_KINDS)
    conditions = []
    for kind in BACKEND_KINDS.values():
        options = kind.load(kind.options).model_json_schema(mode="validation", ref_template="#/$defs/{model}")
        for name, nested in options.pop("$defs", {}).items():
            definitions.setdefault(name, nested)
        name = f"{kind.load(kind.options).__name__}"
        definitions[name] = without_required(options)
        options_ref = {"$ref": f"#/$defs/{name}"}
        conditions.append(
            {
                "if": {"properties": {"backend": {"const": kind.name}}},
                "then": {
                    "properties": {
                        "options": options_ref,
                        "replicas": {"items": {"properties": {"options": options_ref}}},
                    }
                },
            }
        )
    deployment["allOf"] = conditions
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": SCHEMA_ID, **schema}
