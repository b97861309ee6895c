"""Builds the ASGI app: Connexion's middleware stack with the front door as its routing, security
and validation layer, each dialect's document added at its configured mount, Connexion's
Swagger UI behind it, and the gateway's own endpoints (/health, /ready, /metrics)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import orjson
from connexion import ConnexionMiddleware
from connexion.middleware.lifespan import LifespanMiddleware
from connexion.middleware.swagger_ui import SwaggerUIMiddleware
from connexion.options import SwaggerUIOptions
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.chat import ChatPipeline
from gateway.config.settings import Settings
from gateway.core.collector import settle_collector
from gateway.core.errors import NotFound, Unauthorized
from gateway.core.memory import return_large_blocks
from gateway.core.options import ConfigError
from gateway.core.terminal import bounded
from gateway.dialects.dialect import Dialect
from gateway.dialects.registry import DIALECTS
from gateway.dialects.translator import DocumentFacts, Translator
from gateway.http.call import Call
from gateway.http.documents import DialectSpec, load_document
from gateway.http.error_dialects import ErrorDialects
from gateway.http.front_door import HTTP_METHODS, FrontDoor, Handler, connexion_view
from gateway.http.lifecycle import Lifecycle
from gateway.http.unserved import PATH_SHOWN
from gateway.policy.auth import KeyStore, Scheme, authenticate
from gateway.probes.deployments import DeploymentProbes
from gateway.runtime import Runtime
from gateway.telemetry.access_log import AccessLog
from gateway.telemetry.metrics import Metrics

log = logging.getLogger("chatgate")
RETIRE_MARGIN = 5.0  # seconds past the longest request's limit before a retired runtime closes
JSON = "application/json"


# how /ready's caller may present a key: as each dialect's clients do
READY_KEY_SCHEMES = (
    Scheme("authorization", bearer=True),
    Scheme("api-key", bearer=False),
    Scheme("x-api-key", bearer=False),
)


def shows_details(keys: KeyStore, headers: dict[str, str]) -> bool:
    """Whether /ready names deployments and what probing found: on a gateway with keys, only to a
    caller with one (a load balancer needs the status alone; the rest is for operators)."""
    if not keys.enabled:
        return True
    try:
        authenticate(keys, READY_KEY_SCHEMES, headers)
    except Unauthorized:
        return False
    return True


def gateway_endpoints(current: CurrentRuntime, lifecycle: Lifecycle) -> dict[str, Any]:
    """The gateway's own endpoints, outside every dialect: path → handler."""

    async def health(call: Call) -> Response:
        """Liveness: the process answers."""
        return Response(b'{"status":"ok"}', media_type=JSON)

    async def ready(call: Call) -> Response:
        """Readiness: 503 while draining, or while the rate-limit store does not answer where the
        gateway refuses requests without it (fail-closed). A deployment whose every replica is
        ejected makes it "degraded", still 200: its requests still try them (panic routing), and
        taking the gateway out of its load balancer would fail every other deployment too."""
        runtime = current.runtime
        unhealthy = runtime.router.unhealthy()
        store_reachable = await runtime.limiter.reachable()
        limits = runtime.settings.rate_limits
        store_needed = limits.store == "redis" and limits.redis is not None
        store_needed = store_needed and limits.redis is not None and limits.redis.on_error == "fail-closed"
        if lifecycle.draining:
            status = "draining"
        elif store_needed and not store_reachable:
            status = "unavailable"
        elif unhealthy:
            status = "degraded"
        else:
            status = "ready"
        body: dict[str, Any] = {"status": status}
        if shows_details(runtime.keys, call.headers):
            body["unhealthy"] = unhealthy
            body["limit_store_reachable"] = store_reachable
            if current.probes.results:  # what the deployments with `probe: true` were found to honour
                body["probes"] = current.probes.summary()
        code = 200 if status in ("ready", "degraded") else 503
        return Response(orjson.dumps(body), status_code=code, media_type=JSON)

    async def metrics(call: Call) -> Response:
        metrics = current.runtime.metrics
        return Response(metrics.exposition(), media_type=metrics.content_type)

    return {"/health": health, "/ready": ready, "/metrics": metrics}


def not_found(fallback: Translator[Any]) -> ASGIApp:
    """What lies behind everything: a path nothing answered (a Swagger UI file that is not there;
    the front door records it, and answers every other path nothing serves itself)."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        rendered = fallback.error(NotFound(f"Not found: {bounded(scope['path'], PATH_SHOWN)}"), "")
        response = Response(rendered.json(), status_code=404, media_type=JSON, headers=rendered.headers)
        await response(scope, receive, send)

    return app


class CurrentRuntime:
    """What requests are answered with now: the runtime, and the operations' handlers built on it.
    A reload builds the next from new settings and swaps it whole; requests in flight finish on
    the one they started with, and what the new one did not take over is closed when the last of
    them has ended (or has run past its deployment's total timeout, when it ends anyway)."""

    def __init__(
        self,
        settings: Settings,
        mounted: list[tuple[Dialect, str]],
        translators: dict[str, Translator[Any]],
        lifecycle: Lifecycle,
    ) -> None:
        self.mounted = mounted
        self.translators = translators
        self.lifecycle = lifecycle
        self.runtime = Runtime(settings)
        self.handlers = self.handlers_on(self.runtime)
        self.probes = DeploymentProbes(self.runtime.router)  # started with the event loop
        self.front_door: FrontDoor | None = None  # once Connexion has built it
        self.retiring: set[asyncio.Task[None]] = set()

    def attach(self, front_door: FrontDoor) -> None:
        """The front door Connexion has just built (on the lifespan startup, or else the first
        request): it answers with the current runtime, and serves the gateway's own endpoints."""
        self.front_door = front_door
        front_door.use(self.runtime.keys, self.runtime.tracing)
        for path, handler in gateway_endpoints(self, self.lifecycle).items():
            front_door.add_route("GET", path, handler)

    def handlers_on(self, runtime: Runtime) -> dict[tuple[str, str], Handler]:
        found: dict[tuple[str, str], Handler] = {}
        for dialect, _mount in self.mounted:
            translator = self.translators[dialect.name]
            for operation_id, handler in dialect.operations(runtime, translator).items():
                found[dialect.name, operation_id] = handler
            chat = ChatPipeline(runtime, dialect, translator)
            for operation_id in dialect.chat_operations:
                found[dialect.name, operation_id] = chat
            for operation_id, own in dialect.own_chat.items():
                own_translator = self.translators[f"{dialect.name}.{operation_id}"]
                hook = own.hook(runtime, own_translator) if own.hook is not None else None
                found[dialect.name, operation_id] = ChatPipeline(runtime, dialect, own_translator, hook)
        return found

    def handler(self, dialect: str, operation_id: str) -> Handler:
        """The operation's handler in whichever runtime is current when a request comes."""
        key = (dialect, operation_id)

        async def current(call: Call) -> Response:
            return await self.handlers[key](call)

        return current

    async def reload(self, settings: Settings) -> None:
        previous = self.runtime
        runtime = Runtime(settings, previous)
        self.runtime, self.handlers = runtime, self.handlers_on(runtime)
        runtime.router.start()
        previous_probes, self.probes = self.probes, DeploymentProbes(runtime.router, self.probes)
        self.probes.start()
        if self.front_door is not None:
            self.front_door.use(runtime.keys, runtime.tracing)
        task = asyncio.get_running_loop().create_task(self.retire(previous, runtime))
        self.retiring.add(task)
        task.add_done_callback(self.retiring.discard)
        await previous_probes.aclose()

    @staticmethod
    async def retire(previous: Runtime, successor: Runtime) -> None:
        if not await previous.finished(previous.longest_request + RETIRE_MARGIN):
            log.warning("reload: %d requests still running past their time limit", previous.in_flight)
        await previous.retire(successor)


@dataclass(frozen=True, slots=True)
class Gateway:
    """The ASGI app, and what the server around it needs before it starts."""

    app: ASGIApp
    current: CurrentRuntime
    error_dialects: ErrorDialects  # renders the connection layer's own errors

    @property
    def metrics(self) -> Metrics:
        return self.current.runtime.metrics  # the same object across reloads


def create_app(
    settings: Settings, access_log: AccessLog | None = None, lifecycle: Lifecycle | None = None
) -> ASGIApp:
    return build_gateway(settings, access_log, lifecycle).app


def build_gateway(
    settings: Settings, access_log: AccessLog | None = None, lifecycle: Lifecycle | None = None
) -> Gateway:
    """Connexion's middleware with the front door in it. Connexion builds its middleware stack
    (and with it the front door, which compiles the documents' tables) when the ASGI server sends
    the lifespan startup, before the first request; the front door then attaches to `CurrentRuntime`."""
    lifecycle = lifecycle or Lifecycle()
    mounted = mounted_dialects(settings)
    refuse_clashing_mounts(mounted)
    translators = {
        dialect.name: dialect.translator(facts_of(load_document(dialect.document), dialect.chat_operations))
        for dialect, _ in mounted
    }
    # a chat operation with a translator of its own: keyed "<dialect>.<operationId>"
    translators.update(
        {
            f"{dialect.name}.{operation_id}": own.translator(
                facts_of(load_document(dialect.document), (operation_id,))
            )
            for dialect, _ in mounted
            for operation_id, own in dialect.own_chat.items()
        }
    )
    current = CurrentRuntime(settings, mounted, translators, lifecycle)
    lifecycle.reload = current.reload

    @contextlib.asynccontextmanager
    async def lifespan(_app: Any) -> AsyncIterator[None]:
        settle_collector()  # gateway/core/collector.py
        return_large_blocks()  # a large answer's memory goes back to the system (gateway/core/memory.py)
        current.probes.start()  # in the background: start waits for none of it
        current.runtime.router.start()  # the replicas' load reads, where deployments route on them
        if (said := await current.runtime.limiter.started()) is not None:
            log.log(*said)  # once per worker: where the limit store is, and whether it answers
        yield
        await current.probes.aclose()
        await current.runtime.aclose()

    fallback = translators.get("openai") or next(iter(translators.values()), None)
    fallback = fallback or DIALECTS["openai"].translator(DocumentFacts(frozenset()))
    error_dialects = ErrorDialects([(mount, translators[d.name]) for d, mount in mounted], fallback)
    front_door = functools.partial(
        FrontDoor,
        key_store=current.runtime.keys,
        metrics=current.runtime.metrics,
        access_log=access_log or AccessLog(None),
        max_body_bytes=settings.server.max_body_bytes,
        error_dialects=error_dialects,
        tracing=current.runtime.tracing,
        on_built=current.attach,
    )
    app = ConnexionMiddleware(
        not_found(fallback),
        middlewares=[front_door, SwaggerUIMiddleware, LifespanMiddleware],
        lifespan=lifespan,
        swagger_ui_options=SwaggerUIOptions(swagger_ui=True, serve_spec=False),
    )
    for dialect, mount in mounted:
        document = load_document(dialect.document)
        operation_ids = [
            op["operationId"]
            for item in document["paths"].values()
            for op in item.values()
            if isinstance(op, dict) and "operationId" in op
        ]
        app.add_api(
            connexion_view(document),
            base_path=mount,
            document=document,
            name=dialect.name,
            translator=translators[dialect.name],
            own_translators={op: translators[f"{dialect.name}.{op}"] for op in dialect.own_chat},
            handlers={op: current.handler(dialect.name, op) for op in operation_ids},
            dialect=dialect.name,
        )
    return Gateway(app, current, error_dialects)


def mounted_dialects(settings: Settings) -> list[tuple[Dialect, str]]:
    return [(DIALECTS[name], mount) for name, mount in settings.mounts.items() if mount is not None]


def refuse_clashing_mounts(mounted: list[tuple[Dialect, str]]) -> None:
    """Two dialects whose mounts put an operation on one method and path (Anthropic's at `/`
    beside OpenAI's at `/v1`: both have GET /v1/models) are refused at start, naming both: else
    one would answer for the other in silence."""
    owner: dict[tuple[str, str], str] = {}
    for dialect, mount in mounted:
        for path, item in load_document(dialect.document)["paths"].items():
            route = mount.rstrip("/") + path
            for method in (m for m in item if m in HTTP_METHODS):
                if (other := owner.setdefault((method, route), dialect.name)) != dialect.name:
                    raise ConfigError(
                        f"mounts: {method.upper()} {route} is an operation of both {other} and "
                        f"{dialect.name}; mount one of them elsewhere"
                    )


def facts_of(document: dict[str, Any], chat_operations: tuple[str, ...]) -> DocumentFacts:
    spec = DialectSpec(document, frozenset(chat_operations))
    return DocumentFacts(spec.chat_fields, spec.unsupported, spec.rules, spec.defaults)
