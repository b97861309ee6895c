"""`GET <mount>/openapi.json` (and `.yaml`) answer the committed document as the gateway runs it.

Users who generate clients or run conformance tools from the served document get the one in
openapi/, with two differences that describe the running server: `servers` names the mount the
gateway serves the dialect at, and a gateway with no keys configured declares no `security` (it
enforces none: a document that declared it would promise checks the gateway does not make). The
bodies are rendered once, at start.
"""

from __future__ import annotations

import copy
from typing import Any

import orjson
import yaml

SPEC_PATH = "/openapi.json"
YAML_SPEC_PATH = "/openapi.yaml"
HTTP_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
# libyaml's emitter where PyYAML was built with it: the pure-Python one took most of a start
SAFE_DUMPER: type[yaml.SafeDumper] = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def served_document(document: dict[str, Any], mount: str, keys_enforced: bool = True) -> dict[str, Any]:
    """The committed document as served at `mount`, by a gateway that does or does not enforce keys."""
    served = copy.deepcopy(document)
    served["servers"] = [{"url": mount or "/"}]
    if not keys_enforced:
        served.pop("security", None)
        for item in served.get("paths", {}).values():
            for method in HTTP_METHODS:
                if isinstance(item.get(method), dict):
                    item[method].pop("security", None)
    return served


def served_bodies(
    document: dict[str, Any], mount: str, keys_enforced: bool = True
) -> dict[str, tuple[bytes, bytes]]:
    """Path → (media type, body) of the document in JSON and in YAML."""
    served = served_document(document, mount, keys_enforced)
    return {
        mount + SPEC_PATH: (b"application/json", orjson.dumps(served)),
        mount + YAML_SPEC_PATH: (
            b"application/yaml",
            yaml.dump(served, Dumper=SAFE_DUMPER, sort_keys=False, allow_unicode=True).encode(),
        ),
    }
