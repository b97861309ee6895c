"""`GET <mount>/openapi.json` (and `.yaml`) answer the committed document as the gateway runs it.

Users who generate clients or run conformance tools from the served document get the one in
openapi/, with two differences that describe the running server: `servers` names the mount the
gateway serves the dialect at, and a gateway with no keys configured declares its security
optional: every alternative the document names, plus `{}` (no credentials). A client generated
from an open gateway's document so still has a place for a key, and carries it to a keyed
gateway; the front door reads the schemes from the committed document, so `{}` opens nothing.
The JSON body is rendered once, at start; the YAML one when it is first asked for (rendering it
took a tenth of a start, and few clients ask).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import orjson
import yaml

from gateway.http.documents import HTTP_METHODS

SPEC_PATH = "/openapi.json"
YAML_SPEC_PATH = "/openapi.yaml"
# libyaml's emitter where PyYAML was built with it: the pure-Python one took most of a start
SAFE_DUMPER: type[yaml.SafeDumper] = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def served_document(document: dict[str, Any], mount: str, keys_enforced: bool = True) -> dict[str, Any]:
    """The committed document as served at `mount`, by a gateway that does or does not enforce keys."""
    served = copy.deepcopy(document)
    served["servers"] = [{"url": mount or "/"}]
    if not keys_enforced:
        if "security" in served:
            served["security"] = optional(served["security"])
        for item in served.get("paths", {}).values():
            for method in HTTP_METHODS:
                if isinstance(item.get(method), dict) and "security" in item[method]:
                    item[method]["security"] = optional(item[method]["security"])
    return served


def optional(requirements: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Security requirements that also admit a caller without credentials (`{}`); an operation
    that is public already (`[]`) stays as it is."""
    if not requirements or {} in requirements:
        return requirements
    return [*requirements, {}]


class ServedBody:
    """One served form of a document: its media type, and its body rendered once, when asked."""

    __slots__ = ("_body", "_render", "media_type")

    def __init__(self, media_type: bytes, render: Callable[[], bytes]) -> None:
        self.media_type = media_type
        self._render: Callable[[], bytes] | None = render
        self._body = b""

    @property
    def body(self) -> bytes:
        if self._render is not None:
            self._body, self._render = self._render(), None
        return self._body


def served_bodies(document: dict[str, Any], mount: str, keys_enforced: bool = True) -> dict[str, ServedBody]:
    """Path → the document in JSON and in YAML."""
    served = served_document(document, mount, keys_enforced)
    json_body = orjson.dumps(served)
    return {
        mount + SPEC_PATH: ServedBody(b"application/json", lambda: json_body),
        mount + YAML_SPEC_PATH: ServedBody(
            b"application/yaml",
            lambda: yaml.dump(served, Dumper=SAFE_DUMPER, sort_keys=False, allow_unicode=True).encode(),
        ),
    }
