"""`GET <mount>/openapi.json` (and `.yaml`) answer the committed document, not a rendering of it.

Users who generate clients or run conformance tools from the served document get the one in
openapi/; only `servers` differs: it names the mount the gateway serves the dialect at. The
bodies are rendered once, at start.
"""

from __future__ import annotations

import copy
from typing import Any

import orjson
import yaml

SPEC_PATH = "/openapi.json"
YAML_SPEC_PATH = "/openapi.yaml"


def served_document(document: dict[str, Any], mount: str) -> dict[str, Any]:
    """The committed document as served at `mount`: only `servers` changes."""
    served = copy.deepcopy(document)
    served["servers"] = [{"url": mount or "/"}]
    return served


def served_bodies(document: dict[str, Any], mount: str) -> dict[str, tuple[bytes, bytes]]:
    """Path → (media type, body) of the document in JSON and in YAML."""
    served = served_document(document, mount)
    return {
        mount + SPEC_PATH: (b"application/json", orjson.dumps(served)),
        mount + YAML_SPEC_PATH: (
            b"application/yaml",
            yaml.safe_dump(served, sort_keys=False, allow_unicode=True).encode(),
        ),
    }
