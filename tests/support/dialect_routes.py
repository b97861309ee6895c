"""Where each dialect's chat operations live, derived from the registry and the documents, so a
new dialect is covered by the suite's tables without editing them."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

from gateway.config.settings import Settings
from gateway.dialects.registry import DIALECTS
from gateway.http.documents import load_document, resolve
from tests.support.readers import reader


@dataclass(frozen=True)
class ChatRoute:
    dialect: str  # its name in the registry
    document: str  # its file in openapi/
    operation_id: str
    doc_path: str  # the operation's path in the document
    url: str  # on the default mounts, with every required query parameter
    query: tuple[tuple[str, str], ...]  # those parameters
    tag: str
    request_schema: str  # the request body's schema name
    response_schema: str  # the 200 JSON answer's schema name
    requires_model: bool  # whether the body must name a model

    def body(self, content: str = "Hello!", model: str = "echo", **extra: Any) -> dict[str, Any]:
        """The smallest valid chat body in the dialect's shape (tests/support/readers.py), plus
        `extra`; the model only where the body must name one."""
        return reader(self.dialect).body(content, model if self.requires_model else None, **extra)


def schema_name(node: dict[str, Any]) -> str:
    return node["$ref"].rsplit("/", 1)[-1]


def example_value(document: dict[str, Any], parameter: dict[str, Any]) -> str:
    schema = resolve(document, parameter.get("schema", {}))
    for value in (parameter.get("example"), schema.get("default"), *(schema.get("enum") or [None])):
        if value is not None:
            return str(value)
    raise AssertionError(f"required parameter {parameter['name']} has no example to send")


@cache
def chat_routes() -> tuple[ChatRoute, ...]:
    """Every chat operation of every dialect, on the default mounts."""
    mounts = Settings().mounts
    found = []
    for name, dialect in DIALECTS.items():
        document = load_document(dialect.document)
        for doc_path, item in document["paths"].items():
            operation = item.get("post")
            if operation is None or operation["operationId"] not in dialect.chat_operations:
                continue
            parameters = [
                resolve(document, p) for p in [*item.get("parameters", []), *operation.get("parameters", [])]
            ]
            query = tuple(
                (p["name"], example_value(document, p))
                for p in parameters
                if p["in"] == "query" and p.get("required")
            )
            body = resolve(document, operation["requestBody"])["content"]["application/json"]["schema"]
            answer = resolve(document, operation["responses"]["200"])["content"]["application/json"]["schema"]
            url = (mounts[name] or "") + doc_path
            if query:
                url += "?" + "&".join(f"{k}={v}" for k, v in query)
            found.append(
                ChatRoute(
                    dialect=name,
                    document=dialect.document,
                    operation_id=operation["operationId"],
                    doc_path=doc_path,
                    url=url,
                    query=query,
                    tag=operation.get("tags", ["default"])[0],
                    request_schema=schema_name(body),
                    response_schema=schema_name(answer),
                    requires_model="model" in resolve(document, body).get("required", []),
                )
            )
    return tuple(found)


def main_routes() -> dict[str, ChatRoute]:
    """Each dialect's first chat operation (the one its SDKs use)."""
    found: dict[str, ChatRoute] = {}
    for route in chat_routes():
        found.setdefault(route.dialect, route)
    return found
