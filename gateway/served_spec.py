"""`GET <mount>/openapi.json` answers the committed document, not Connexion's rendering of it.

Connexion serves every `$ref` resolved and inlined (a different, much larger document, rebuilt
on every request); users who generate clients or run conformance tools from the served document
should get the one in openapi/. Only `servers` differs: it names the mount the gateway serves
the dialect at. The JSON is rendered once, at start.
"""

from __future__ import annotations

import copy
from typing import Any

import orjson
import yaml
from starlette.types import ASGIApp, Receive, Scope, Send

SPEC_PATH = "/openapi.json"
YAML_SPEC_PATH = "/openapi.yaml"


def served_document(document: dict[str, Any], mount: str) -> dict[str, Any]:
    """The committed document as served at `mount`: only `servers` changes."""
    served = copy.deepcopy(document)
    served["servers"] = [{"url": mount or "/"}]
    return served


class ServedDocuments:
    """An ASGI layer that answers `GET|HEAD <mount>/openapi.json` and `<mount>/openapi.yaml`
    for each dialect."""

    def __init__(self, app: ASGIApp, documents: dict[str, dict[str, Any]]) -> None:
        """`documents` maps a mount ("" for the root) to the dialect's committed document."""
        self.app = app
        self.bodies: dict[str, tuple[bytes, bytes]] = {}
        for mount, document in documents.items():
            served = served_document(document, mount)
            self.bodies[mount + SPEC_PATH] = (b"application/json", orjson.dumps(served))
            self.bodies[mount + YAML_SPEC_PATH] = (
                b"application/yaml",
                yaml.safe_dump(served, sort_keys=False, allow_unicode=True).encode(),
            )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = self.bodies.get(scope["path"]) if scope["type"] == "http" else None
        if found is None or scope["method"] not in ("GET", "HEAD"):
            await self.app(scope, receive, send)
            return
        media_type, body = found
        headers = [(b"content-type", media_type), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body})
