"""The chat operations' own path: routing, auth and validation from the dialects' documents,
compiled once at start into one table, in one ASGI layer in front of Connexion.

Connexion routes every request four times over (routing, security, validation, context, each
matching the path again) and builds request objects for each; on the chat operations that
was about half of the gateway's CPU. This layer does the same checks from the same documents
for `POST <mount><chat path>`; every other request, the Swagger UI and the spec documents keep
Connexion's way. The schemathesis suites hold both ways to the documents.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

import jsonschema_rs
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.core.errors import BadRequest, GatewayError, InternalError, Unauthorized, UnsupportedMediaType
from gateway.policy.auth import Caller, KeyStore
from gateway.validation import BODY_SCOPE_KEY, compile_schema, parse_and_validate, read_body

if TYPE_CHECKING:
    from gateway.dialects.base import Dialect

log = logging.getLogger("chatgate")
JSON_MEDIA_TYPES = ("application/json",)


@dataclass(frozen=True, slots=True)
class Parameter:
    name: str
    location: str  # "query" | "header"
    required: bool
    kind: str | None  # the schema's type, for turning the string into a value
    enum: tuple[Any, ...] | None  # named in full when a value is refused
    validator: jsonschema_rs.Draft4Validator


@dataclass(frozen=True, slots=True)
class ChatOperation:
    dialect: Dialect
    operation_id: str
    secured: bool
    parameters: tuple[Parameter, ...]
    body: jsonschema_rs.Draft4Validator


def compile_operation(dialect: Dialect, path: str, operation_id: str) -> ChatOperation:
    """One chat operation of a dialect's document, ready to check requests against."""
    spec = dialect.spec
    document = spec.document
    item = document["paths"][path]
    operation = item["post"]
    parameters = []
    for raw in [*item.get("parameters", []), *operation.get("parameters", [])]:
        parameter = spec.resolve(raw)
        if parameter["in"] not in ("query", "header"):
            continue
        schema = spec.resolve(parameter.get("schema", {}))
        parameters.append(
            Parameter(
                name=parameter["name"] if parameter["in"] == "query" else parameter["name"].lower(),
                location=parameter["in"],
                required=bool(parameter.get("required")),
                kind=schema.get("type"),
                enum=tuple(schema["enum"]) if "enum" in schema else None,
                validator=compile_schema(schema, document.get("components")),
            )
        )
    body_schema = spec.request_schema(operation_id)
    return ChatOperation(
        dialect=dialect,
        operation_id=operation_id,
        secured=bool(operation.get("security", document.get("security"))),
        parameters=tuple(parameters),
        body=compile_schema(body_schema, document.get("components")),
    )


def typed(value: str, kind: str | None) -> Any:
    """A query or header string as the parameter's schema types it."""
    if kind == "boolean":
        lowered = value.lower()
        if lowered in ("true", "false"):
            return lowered == "true"
    elif kind == "integer":
        try:
            return int(value)
        except ValueError:
            pass
    elif kind == "number":
        try:
            return float(value)
        except ValueError:
            pass
    return value


class ChatRouter:
    def __init__(
        self,
        app: ASGIApp,
        operations: dict[str, ChatOperation],
        key_store: KeyStore,
        max_body_bytes: int,
        error_response: Callable[[Dialect, GatewayError, Scope], Response],
    ) -> None:
        self.app = app
        self.operations = operations  # request path → operation
        self.key_store = key_store
        self.max_body_bytes = max_body_bytes
        self.error_response = error_response

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        operation = None
        if scope["type"] == "http" and scope["method"] == "POST":
            operation = self.operations.get(scope["path"])
        if operation is None:
            await self.app(scope, receive, send)
            return
        try:
            response = await self.answer(operation, scope, receive)
        except GatewayError as error:
            response = self.error_response(operation.dialect, error, scope)
        except Exception:
            log.exception("chat operation failed")
            error = InternalError("The gateway failed to handle this request.")
            response = self.error_response(operation.dialect, error, scope)
        await response(scope, receive, send)

    async def answer(self, operation: ChatOperation, scope: Scope, receive: Receive) -> Response:
        headers: dict[str, str] = {}
        for name, value in scope["headers"]:
            headers[name.decode("latin-1")] = value.decode("latin-1")
        caller = self.authenticate(operation, headers)
        self.check_parameters(operation, scope, headers)
        # no Content-Type is read as the operation's own (JSON), as Connexion does elsewhere
        media_type = headers.get("content-type", JSON_MEDIA_TYPES[0]).partition(";")[0].strip().lower()
        if media_type not in JSON_MEDIA_TYPES:
            raise UnsupportedMediaType(f"Invalid Content-type ({media_type}), expected ['application/json']")
        scope[BODY_SCOPE_KEY] = parse_and_validate(
            await read_body(receive, self.max_body_bytes), operation.body
        )
        context = scope.setdefault("extensions", {}).setdefault("connexion_context", {})
        context["token_info"] = {"sub": caller.name, "caller": caller}
        return await operation.dialect.chat(scope)

    def authenticate(self, operation: ChatOperation, headers: dict[str, str]) -> Caller:
        """Bearer or api-key, as the documents' security schemes say (open without keys)."""
        if not operation.secured or not self.key_store.enabled:
            return Caller(None)
        authorization = headers.get("authorization")
        api_key = headers.get("api-key")
        if authorization is None and api_key is None:
            raise Unauthorized("No authorization token provided")
        problem = "Provided key is not valid"
        if authorization is not None:
            scheme, _, token = authorization.partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                problem = "Invalid authorization header"
            elif key := self.key_store.find(token.strip()):
                return Caller(key)
        if api_key is not None and (key := self.key_store.find(api_key)):
            return Caller(key)
        raise Unauthorized(problem)

    @staticmethod
    def check_parameters(operation: ChatOperation, scope: Scope, headers: dict[str, str]) -> None:
        query = dict(parse_qsl(scope["query_string"].decode("latin-1"), keep_blank_values=True))
        for parameter in operation.parameters:
            source = query if parameter.location == "query" else headers
            raw = source.get(parameter.name)
            if raw is None:
                if parameter.required:
                    raise BadRequest(
                        f"Missing {parameter.location} parameter '{parameter.name}'",
                        param=parameter.name,
                        loc=[parameter.location, parameter.name],
                    )
                continue
            error = next(parameter.validator.iter_errors(typed(raw, parameter.kind)), None)
            if error is not None:
                why = error.message
                if parameter.enum is not None:
                    why = f"'{raw}' is not one of {', '.join(map(str, parameter.enum))}"
                raise BadRequest(
                    f"{why} for {parameter.location} parameter '{parameter.name}'",
                    param=parameter.name,
                    loc=[parameter.location, parameter.name],
                    value=raw,
                )


ChatHandler = Callable[[Scope], Awaitable[Response]]
