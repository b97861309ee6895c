"""Builds the ASGI app: Connexion's middleware stack with the front door as its routing, security
and validation layer, each dialect's document added at its configured mount, Connexion's
Swagger UI behind it, and the gateway's own endpoints (/health, /ready, /metrics)."""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
from collections.abc import AsyncIterator
from typing import Any

import orjson
from connexion import ConnexionMiddleware
from connexion.middleware.lifespan import LifespanMiddleware
from connexion.middleware.swagger_ui import SwaggerUIMiddleware
from connexion.options import SwaggerUIOptions
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.access_log import AccessLog
from gateway.call import Call
from gateway.config import Settings
from gateway.core.errors import NotFound
from gateway.dialects import DIALECTS
from gateway.dialects.shape import DocumentFacts, OpenAIShaped
from gateway.front_door import FrontDoor
from gateway.lifecycle import Lifecycle
from gateway.pipeline import ChatPipeline
from gateway.runtime import Runtime
from gateway.spec import DialectSpec, load_document

log = logging.getLogger("chatgate")
YOUNG_GC_THRESHOLD = 20_000
JSON = "application/json"


def gateway_endpoints(runtime: Runtime, lifecycle: Lifecycle) -> dict[str, Any]:
    """The gateway's own endpoints, outside every dialect: path → handler."""
    settings = runtime.settings

    async def health(call: Call) -> Response:
        """Liveness: the process answers."""
        return Response(b'{"status":"ok"}', media_type=JSON)

    async def ready(call: Call) -> Response:
        """Readiness: not draining, every deployment has a healthy replica, and the rate-limit
        store answers where the gateway refuses requests without it (fail-closed)."""
        unhealthy = runtime.router.unhealthy()
        store_reachable = await runtime.limiter.reachable()
        limits = settings.rate_limits
        store_needed = limits.store == "redis" and limits.redis is not None
        store_needed = store_needed and limits.redis is not None and limits.redis.on_error == "fail-closed"
        if lifecycle.draining:
            status = "draining"
        elif unhealthy or (store_needed and not store_reachable):
            status = "unavailable"
        else:
            status = "ready"
        body = {"status": status, "unhealthy": unhealthy, "limit_store_reachable": store_reachable}
        return Response(orjson.dumps(body), status_code=200 if status == "ready" else 503, media_type=JSON)

    async def metrics(call: Call) -> Response:
        return Response(runtime.metrics.exposition(), media_type=runtime.metrics.content_type)

    return {"/health": health, "/ready": ready, "/metrics": metrics}


def not_found(fallback: OpenAIShaped) -> ASGIApp:
    """What lies behind everything: a path nothing answered (a Swagger UI file that is not there)."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        rendered = fallback.error(NotFound(f"Not found: {scope['path']}"), "")
        response = Response(rendered.json(), status_code=404, media_type=JSON, headers=rendered.headers)
        await response(scope, receive, send)

    return app


def create_app(
    settings: Settings, access_log: AccessLog | None = None, lifecycle: Lifecycle | None = None
) -> ASGIApp:
    runtime = Runtime(settings)
    lifecycle = lifecycle or Lifecycle()

    @contextlib.asynccontextmanager
    async def lifespan(_app: Any) -> AsyncIterator[None]:
        # The documents and compiled tables live forever: keep them out of the garbage
        # collector's scans, which otherwise stall requests for milliseconds.
        gc.collect()
        gc.freeze()
        # A request allocates a few hundred container objects, nearly all freed by reference
        # counting; the default (a young-generation scan every 700) ran a scan every couple of
        # requests. Every 20,000 cost about 8% less CPU per request in the benchmark.
        gc.set_threshold(YOUNG_GC_THRESHOLD, *gc.get_threshold()[1:])
        yield
        await runtime.aclose()

    mounted = [(DIALECTS[name], mount) for name, mount in settings.mounts.items() if mount is not None]
    translators = {
        dialect.name: dialect.translator(facts_of(load_document(dialect.document), dialect.chat_operations))
        for dialect, _ in mounted
    }
    fallback = translators.get("openai") or next(iter(translators.values()), None)
    fallback = fallback or DIALECTS["openai"].translator(DocumentFacts(frozenset()))
    front_door = functools.partial(
        FrontDoor,
        key_store=runtime.keys,
        metrics=runtime.metrics,
        access_log=access_log or AccessLog(None),
        max_body_bytes=settings.server.max_body_bytes,
        fallback=fallback,
    )
    app = ConnexionMiddleware(
        not_found(fallback),
        middlewares=[front_door, SwaggerUIMiddleware, LifespanMiddleware],
        lifespan=lifespan,
        swagger_ui_options=SwaggerUIOptions(swagger_ui=True, serve_spec=False),
    )
    for dialect, mount in mounted:
        translator = translators[dialect.name]
        handlers = dict(dialect.operations(runtime, translator))
        chat = ChatPipeline(runtime, dialect, translator)
        handlers.update({operation_id: chat for operation_id in dialect.chat_operations})
        app.add_api(
            load_document(dialect.document),
            base_path=mount,
            name=dialect.name,
            translator=translator,
            handlers=handlers,
            dialect=dialect.name,
        )
    # Build the middleware stack now (Connexion would on the first request): the tables are
    # compiled at start, and the gateway's own endpoints join the front door's.
    app.app, app.middleware_stack = app._build_middleware_stack()
    for path, handler in gateway_endpoints(runtime, lifecycle).items():
        front_door_of(app).add_route("GET", path, handler)
    return app


def front_door_of(app: ConnexionMiddleware) -> FrontDoor:
    return next(m for m in app.middleware_stack or () if isinstance(m, FrontDoor))


def facts_of(document: dict[str, Any], chat_operations: tuple[str, ...]) -> DocumentFacts:
    spec = DialectSpec(document, frozenset(chat_operations))
    return DocumentFacts(spec.chat_fields, spec.unsupported, spec.rules)
