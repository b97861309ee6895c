"""The front door: every request's one way in, compiled from the dialects' documents.

A Connexion middleware (`SpecMiddleware`: Connexion hands it each dialect's document through
`add_api`, beside the small view of it that Connexion itself reads: see `connexion_view`) that
replaces Connexion's routing, security and validation layers with one table compiled at start:
method and path → operation, with its parameters' validators, its body's validator and the key
schemes its document names. For each request it routes (404, 405), authenticates (401), checks
parameters and body (400, 413, 415), hands a `Call` to the operation's handler and renders any
error in the dialect's shape, all in one layer and one pass.
It also serves each dialect's committed document (as this gateway runs it: its mount, and no
`security` when it has no keys), and passes the Swagger UI's paths on to
Connexion's own Swagger UI middleware behind it.

Each request also gets a request id (the client's, if it sent a safe one) and, but for the
gateway's own endpoints (/health, /ready, /metrics: polled, not asked), a `RequestRecord`, which
ends as metrics and one access-log line: a dialect's operation under its route, a document or the
Swagger UI under theirs, a path nothing serves under the one route `unmatched` (never the path
itself, which a client chooses: each would be a series of its own), and a request the connection
refused before routing (gateway/server/edge.py tells it through `ErrorDialects`) under `edge`. A
path nothing serves is answered with the way forward where the path tells it
(gateway/http/unserved.py).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

import jsonschema_rs
from connexion.middleware import SpecMiddleware
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.core.disconnect import client_watch
from gateway.core.errors import (
    BadRequest,
    GatewayError,
    InternalError,
    MethodNotAllowed,
    NotFound,
    UnsupportedMediaType,
    error_for_status,
)
from gateway.core.ids import new_request_id
from gateway.core.terminal import bounded
from gateway.dialects.translator import Translator
from gateway.http.call import Call
from gateway.http.documents import HTTP_METHODS, resolve
from gateway.http.error_dialects import ErrorDialects
from gateway.http.served_documents import ServedBody, served_bodies
from gateway.http.unserved import EDGE, PATH_SHOWN, UNMATCHED, Unserved, gateway_address
from gateway.http.validation import compile_schema, parse_and_validate, read_body
from gateway.policy.auth import ANONYMOUS, KeyStore, Scheme, authenticate, schemes_of
from gateway.telemetry.access_log import AccessLog
from gateway.telemetry.metrics import Metrics
from gateway.telemetry.record import RequestRecord
from gateway.telemetry.tracing import Tracing

log = logging.getLogger("chatgate")
Handler = Callable[[Call], Awaitable[Response]]
REQUEST_ID_HEADER = b"x-request-id"
SAFE_REQUEST_ID = re.compile(rb"^[A-Za-z0-9._:/+=-]{1,200}$")
JSON_MEDIA_TYPE = "application/json"
UI_PATH = "/ui"
UI_HIDDEN_SUFFIXES = (".j2", ".map")  # the UI's page template and source maps: not for clients


@dataclass(frozen=True, slots=True)
class Parameter:
    name: str  # as it is looked up: lower-case for headers
    location: str  # "query" | "header" | "path"
    required: bool
    kind: str | None  # the schema's type, for turning the string into a value
    enum: tuple[Any, ...] | None  # named in full when a value is refused
    validator: jsonschema_rs.Draft4Validator


@dataclass(frozen=True, slots=True)
class Operation:
    route: str  # its path as the document writes it, under its mount
    operation_id: str
    handler: Handler
    translator: Translator[Any] | None  # renders its errors (None: the gateway's own endpoints)
    schemes: tuple[Scheme, ...]  # how a key is presented (none: public)
    parameters: tuple[Parameter, ...]
    body: jsonschema_rs.Draft4Validator | None
    dialect: str = ""  # recorded, metered and logged when set

    @property
    def takes_json(self) -> bool:
        return self.body is not None


def typed(value: str, kind: str | None) -> Any:
    """A query, header or path string as the parameter's schema types it."""
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


def headers_of(scope: Scope) -> dict[str, str]:
    return {name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]}


def template_pattern(path: str) -> re.Pattern[str]:
    """`/models/{model}` → a pattern whose groups are the path parameters."""
    parts = re.split(r"\{([^}]+)\}", path)
    pattern = "".join(re.escape(part) if i % 2 == 0 else f"(?P<{part}>[^/]+)" for i, part in enumerate(parts))
    return re.compile(f"^{pattern}$")


def connexion_view(document: dict[str, Any]) -> dict[str, Any]:
    """What Connexion is given of a document: its version and title, no operations. Connexion
    routes, checks and validates nothing here (the front door does), and its Swagger UI needs only
    the version; given the whole document it would validate it against the OpenAPI schema and
    resolve every reference at each start, a quarter of the time to the first request. The
    documents are checked against the OpenAPI schema by the test suite
    (tests/unit/test_spec_documents.py), and the front door compiles them whole."""
    return {"openapi": document["openapi"], "info": document["info"], "paths": {}}


class FrontDoor(SpecMiddleware):
    def __init__(
        self,
        app: ASGIApp,
        *,
        key_store: KeyStore,
        metrics: Metrics,
        access_log: AccessLog,
        max_body_bytes: int,
        error_dialects: ErrorDialects,
        tracing: Tracing | None = None,
        on_built: Callable[[FrontDoor], None] | None = None,
    ) -> None:
        """Connexion builds it (from a `functools.partial` of these arguments) when it builds its
        middleware stack; `on_built` tells the gateway it exists."""
        self.app = app  # what lies behind: Connexion's Swagger UI, the lifespan
        self.key_store = key_store
        self.metrics = metrics
        self.access_log = access_log
        self.max_body_bytes = max_body_bytes
        self.error_dialects = error_dialects  # renders errors off every operation
        self.tracing = tracing  # None: off
        self.exact: dict[str, dict[str, Operation]] = {}
        self.templated: list[tuple[re.Pattern[str], dict[str, Operation]]] = []
        self.documents: dict[str, ServedBody] = {}  # path → the document served there
        self.ui_prefixes: tuple[str, ...] = ()
        self.unserved = Unserved()  # what a path nothing serves is told
        error_dialects.edge_answered = self.edge_answered
        if on_built is not None:
            on_built(self)

    def use(self, key_store: KeyStore, tracing: Tracing | None) -> None:
        """The keys and tracing of the runtime requests are answered with now (a reload's)."""
        self.key_store = key_store
        self.tracing = tracing

    # ----- compiled at start -----------------------------------------------------------------

    def add_api(
        self,
        specification: Any,  # Connexion's Specification of the view; the document comes whole
        base_path: str | None = None,
        *,
        document: dict[str, Any],
        translator: Translator[Any],
        handlers: dict[str, Handler],
        dialect: str,
        own_translators: dict[str, Translator[Any]] | None = None,
        **_connexion_options: Any,
    ) -> None:
        """Compile one dialect's document, mounted at `base_path`, into the routing table (an
        operation in `own_translators` renders its errors with its own)."""
        mount = (base_path or "").rstrip("/")
        for path, item in document["paths"].items():
            for method in HTTP_METHODS:
                if method not in item:
                    continue
                operation = item[method]
                operation_id = operation["operationId"]
                if operation_id not in handlers:
                    raise ValueError(f"{dialect}: no handler for operation {operation_id}")
                self.add(
                    method.upper(),
                    mount + path,
                    Operation(
                        route=mount + path,
                        operation_id=operation_id,
                        handler=handlers[operation_id],
                        translator=(own_translators or {}).get(operation_id, translator),
                        schemes=schemes_of(document, operation),
                        parameters=self.compile_parameters(document, item, operation),
                        body=self.compile_body(document, operation),
                        dialect=dialect,
                    ),
                )
        self.documents.update(served_bodies(document, mount, keys_enforced=self.key_store.enabled))
        self.ui_prefixes = (*self.ui_prefixes, mount + UI_PATH)
        self.unserved.add(dialect, mount, document)

    def add_route(self, method: str, path: str, handler: Handler) -> None:
        """One of the gateway's own endpoints (/health …): public, unrecorded."""
        self.add(method, path, Operation(path, path, handler, None, (), (), None))

    def add(self, method: str, path: str, operation: Operation) -> None:
        if "{" in path:
            pattern = template_pattern(path)
            for existing, methods in self.templated:
                if existing.pattern == pattern.pattern:
                    methods[method] = operation
                    return
            self.templated.append((pattern, {method: operation}))
        else:
            self.exact.setdefault(path, {})[method] = operation

    def compile_parameters(
        self, document: dict[str, Any], item: dict[str, Any], operation: dict[str, Any]
    ) -> tuple[Parameter, ...]:
        found = []
        for raw in [*item.get("parameters", []), *operation.get("parameters", [])]:
            parameter = resolve(document, raw)
            location = parameter["in"]
            if location not in ("query", "header", "path"):
                continue
            schema = resolve(document, parameter.get("schema", {}))
            found.append(
                Parameter(
                    name=parameter["name"].lower() if location == "header" else parameter["name"],
                    location=location,
                    required=bool(parameter.get("required")) or location == "path",
                    kind=schema.get("type"),
                    enum=tuple(schema["enum"]) if "enum" in schema else None,
                    validator=compile_schema(schema, document.get("components")),
                )
            )
        return tuple(found)

    def compile_body(
        self, document: dict[str, Any], operation: dict[str, Any]
    ) -> jsonschema_rs.Draft4Validator | None:
        body = resolve(document, operation.get("requestBody"))
        if not body:
            return None
        schema = body.get("content", {}).get(JSON_MEDIA_TYPE, {}).get("schema")
        return (
            None if schema is None else compile_schema(resolve(document, schema), document.get("components"))
        )

    # ----- per request ---------------------------------------------------------------------

    def find(
        self, path: str, method: str
    ) -> tuple[Operation | None, dict[str, str], dict[str, Operation] | None]:
        """(the operation, its path parameters, every method of the path) — None when absent."""
        methods = self.exact.get(path)
        params: dict[str, str] = {}
        if methods is None:
            for pattern, candidates in self.templated:
                match = pattern.match(path)
                if match is not None:
                    methods, params = candidates, match.groupdict()
                    break
        if methods is None:
            return None, params, None
        return methods.get(method), params, methods

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        method: str = scope["method"]
        request_id = b""
        for name, value in scope["headers"]:
            if name == REQUEST_ID_HEADER and SAFE_REQUEST_ID.match(value):
                request_id = value
                break
        if not request_id:
            request_id = new_request_id().encode()
        operation, path_params, methods = self.find(path, "GET" if method == "HEAD" else method)
        if operation is None or method == "HEAD":
            if method in ("GET", "HEAD") and (document := self.documents.get(path)) is not None:
                seen = self.recorded(request_id, method, path, path)
                try:
                    await self.send_document(document, method, request_id, send)
                    seen.status = 200
                finally:
                    self.finish(seen)
                return
            if path.startswith(self.ui_prefixes):  # Connexion's Swagger UI, behind this layer
                ui = next(prefix for prefix in self.ui_prefixes if path.startswith(prefix))
                seen = self.recorded(request_id, method, path, ui)
                try:
                    await self.swagger_ui(scope, receive, send, request_id, seen)
                finally:
                    if seen.status == 404:  # a file the UI does not have: a path nothing serves
                        seen.route = UNMATCHED
                    self.finish(seen)
                return
        record: RequestRecord | None = None
        if operation is not None and operation.dialect:
            record = RequestRecord(
                request_id.decode(), method, path, dialect=operation.dialect, route=operation.route
            )
            self.metrics.started()
            if self.tracing is not None:
                record.span = self.tracing.server_span(
                    method, operation.route, scope["headers"], record.request_id
                )
        elif operation is None:  # a path nothing serves, or a method its path does not take
            route = UNMATCHED if methods is None else next(iter(methods.values())).route
            record = self.recorded(request_id, method, path, route)
        try:
            response = await self.answer(scope, receive, operation, path_params, methods, request_id, record)
            await response(scope, receive, self.with_request_id(send, request_id, record))
        finally:
            if record is not None:
                self.finish(record)

    def recorded(self, request_id: bytes, method: str, path: str, route: str) -> RequestRecord:
        """The record of a request no dialect's operation answers, under a route label of the
        gateway's choosing (bounded), in the dialect of the mount the path lies under."""
        self.metrics.started()
        return RequestRecord(
            request_id.decode(), method, path, dialect=self.unserved.dialect_at(path), route=route
        )

    def finish(self, record: RequestRecord) -> None:
        seconds = time.perf_counter() - record.started
        if not record.status:
            record.status = 499  # the client went away before an answer started
        self.metrics.finished(record, seconds)
        self.access_log.write(record, seconds)
        if record.span is not None and self.tracing is not None:
            self.tracing.end_server_span(record.span, record)

    def edge_answered(self, path: str, error: GatewayError, status: int) -> None:
        """A request the connection itself refused before it reached this layer (gateway/server/
        edge.py: 400, 408, 413, 431, 503): recorded under the route `edge`."""
        record = self.recorded(b"", "", path, EDGE)
        record.status, record.error_code = status, error.code
        self.finish(record)

    def not_found(self, scope: Scope) -> NotFound:
        """A path nothing serves: what this gateway serves instead, where the path tells."""
        host = next((value for name, value in scope["headers"] if name == b"host"), None)
        address = gateway_address(scope.get("scheme", "http"), host)
        return NotFound(self.unserved.message(scope["path"], address))

    async def answer(
        self,
        scope: Scope,
        receive: Receive,
        operation: Operation | None,
        path_params: dict[str, str],
        methods: dict[str, Operation] | None,
        request_id: bytes,
        record: RequestRecord | None,
    ) -> Response:
        path = scope["path"]
        translator = operation.translator if operation is not None and operation.translator else None
        try:
            if operation is None:
                if methods is None:
                    raise self.not_found(scope)
                raise MethodNotAllowed(
                    f"Method {bounded(scope['method'], 20)} not allowed for {bounded(path, PATH_SHOWN)}",
                    headers={"Allow": ", ".join(sorted(methods))},
                )
            headers = headers_of(scope)
            caller = ANONYMOUS
            if operation.schemes:
                caller = authenticate(self.key_store, operation.schemes, headers)
            query = self.check_parameters(operation, scope, headers, path_params)
            body = None
            if operation.body is not None:
                # no Content-Type is read as the operation's own (JSON), as clients such as wrk send
                media_type = headers.get("content-type", JSON_MEDIA_TYPE).partition(";")[0].strip().lower()
                if media_type != JSON_MEDIA_TYPE:
                    raise UnsupportedMediaType(
                        f"Invalid Content-type ({media_type}), expected ['application/json']"
                    )
                encoding = headers.get("content-encoding", "identity").strip().lower()
                if encoding not in ("identity", ""):
                    raise UnsupportedMediaType(
                        f"Content-Encoding {encoding} is not supported: send the body uncompressed."
                    )
                body = parse_and_validate(await read_body(receive, self.max_body_bytes), operation.body)
            call = Call(
                request_id=request_id.decode(),
                headers=headers,
                caller=caller,
                record=record or RequestRecord(request_id.decode(), scope["method"], path),
                receive=receive,
                client=client_watch(scope),
                body=body,
                query=query,
                path_params=path_params,
            )
            return await operation.handler(call)
        except GatewayError as error:
            return self.error_response(
                translator or self.error_dialects.translator_for(path), error, request_id, record
            )
        except Exception:
            log.exception("request failed")
            failure = InternalError("The gateway failed to handle this request.")
            return self.error_response(
                translator or self.error_dialects.translator_for(path), failure, request_id, record
            )

    async def swagger_ui(
        self, scope: Scope, receive: Receive, send: Send, request_id: bytes, record: RequestRecord
    ) -> None:
        """Connexion's Swagger UI: its page and the files it loads. A file it does not have (its
        static files raise Starlette's HTTPException, which nothing behind this layer catches)
        and its own template are answered as the dialect answers a path nothing serves."""
        path: str = scope["path"]
        translator = self.error_dialects.translator_for(path)
        with_id = self.with_request_id(send, request_id, record)
        if path.endswith(UI_HIDDEN_SUFFIXES):
            await self.error_response(translator, self.not_found(scope), request_id, record)(
                scope, receive, with_id
            )
            return
        started = False

        async def send_tracked(message: Message) -> None:
            nonlocal started
            started = True
            await with_id(message)

        try:
            await self.app(scope, receive, send_tracked)
        except StarletteHTTPException as error:
            if started:
                raise
            failure = (
                self.not_found(scope)
                if error.status_code == 404
                else error_for_status(error.status_code, str(error.detail))
            )
            await self.error_response(translator, failure, request_id, record)(scope, receive, with_id)

    @staticmethod
    def error_response(
        translator: Translator[Any], error: GatewayError, request_id: bytes, record: RequestRecord | None
    ) -> Response:
        if record is not None:
            record.error_code = error.code
        rendered = translator.error(error, request_id.decode())
        return Response(
            rendered.json(), status_code=rendered.status, media_type=JSON_MEDIA_TYPE, headers=rendered.headers
        )

    @staticmethod
    def check_parameters(
        operation: Operation, scope: Scope, headers: dict[str, str], path_params: dict[str, str]
    ) -> dict[str, str]:
        query: dict[str, str] = {}
        if operation.parameters and scope["query_string"]:  # most requests carry no query
            query = dict(parse_qsl(scope["query_string"].decode("latin-1"), keep_blank_values=True))
        for parameter in operation.parameters:
            source = (
                query
                if parameter.location == "query"
                else headers
                if parameter.location == "header"
                else path_params
            )
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
        return query

    @staticmethod
    async def send_document(document: ServedBody, method: str, request_id: bytes, send: Send) -> None:
        media_type, body = document.media_type, document.body
        headers = [
            (b"content-type", media_type),
            (b"content-length", str(len(body)).encode()),
            (REQUEST_ID_HEADER, request_id),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"" if method == "HEAD" else body})

    @staticmethod
    def with_request_id(send: Send, request_id: bytes, record: RequestRecord | None) -> Send:
        return SendWithId(send, request_id, record)


class SendWithId:
    """`send`, with the request id added to the answer's head and its status recorded. Nothing
    else of the answer needs it: a stream writes its body pieces with `body_send`, the send
    underneath (gateway/http/streaming.py), one call less a chunk."""

    __slots__ = ("body_send", "record", "request_id")

    def __init__(self, send: Send, request_id: bytes, record: RequestRecord | None) -> None:
        self.body_send = send
        self.request_id = request_id
        self.record = record

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            message["headers"] = [*message.get("headers", ()), (REQUEST_ID_HEADER, self.request_id)]
            if self.record is not None:
                self.record.status = message["status"]
        await self.body_send(message)
