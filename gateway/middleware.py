"""The outermost ASGI layer: a request id on every response (the client's, or a fresh one), the
key store where the specs' auth hooks find it, and for chat API requests a trace that ends as
metrics and one access-log line."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.access_log import AccessLog
from gateway.dialects.base import REQUEST_ID_SCOPE_KEY
from gateway.metrics import Metrics
from gateway.policy.auth import KEY_STORE_SCOPE_KEY, KeyStore
from gateway.trace import TRACE_SCOPE_KEY, RequestTrace

REQUEST_ID_HEADER = b"x-request-id"
SAFE_REQUEST_ID = re.compile(rb"^[A-Za-z0-9._:/+=-]{1,200}$")
UNTRACED_PATHS = frozenset({"/health", "/ready", "/metrics"})


class GatewayMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        key_store: KeyStore,
        metrics: Metrics,
        dialect_for: Callable[[str], str | None],
        access_log: AccessLog,
    ) -> None:
        self.app = app
        self.key_store = key_store
        self.metrics = metrics
        self.dialect_for = dialect_for
        self.access_log = access_log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = None
        for name, value in scope["headers"]:
            if name == REQUEST_ID_HEADER and SAFE_REQUEST_ID.match(value):
                request_id = value
                break
        if request_id is None:
            request_id = os.urandom(16).hex().encode()  # as random as uuid4, a third of the cost
        scope[REQUEST_ID_SCOPE_KEY] = request_id.decode()
        scope[KEY_STORE_SCOPE_KEY] = self.key_store
        path = scope["path"]
        dialect = None if path in UNTRACED_PATHS else self.dialect_for(path)
        if dialect is None:
            await self.app(scope, receive, self.with_request_id(send, request_id, None))
            return
        trace = RequestTrace(scope[REQUEST_ID_SCOPE_KEY], scope["method"], path, dialect=dialect)
        scope[TRACE_SCOPE_KEY] = trace
        self.metrics.started()
        try:
            await self.app(scope, receive, self.with_request_id(send, request_id, trace))
        finally:
            seconds = time.perf_counter() - trace.started
            if not trace.status:
                trace.status = 499  # the client went away before an answer started
            self.metrics.finished(trace, seconds)
            self.access_log.write(trace, seconds)

    @staticmethod
    def with_request_id(send: Send, request_id: bytes, trace: RequestTrace | None) -> Send:
        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), (REQUEST_ID_HEADER, request_id)]
                if trace is not None:
                    trace.status = message["status"]
            await send(message)

        return send_with_id
