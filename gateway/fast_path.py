"""The chat operations' lean path through Connexion.

Connexion routes, authenticates and validates each request from the spec; then, per request,
its parameter and response decorators inspect the handler's signature, recompute the body
definition several times and wrap the answer — more work than the rest of the gateway. For
the chat operations this middleware, placed right after validation, calls the dialect's
handler itself. Every other operation takes Connexion's usual way.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

ChatHandler = Callable[[Scope], Awaitable[Response]]


class ChatFastPath:
    def __init__(self, app: ASGIApp, handlers: dict[tuple[str, str], ChatHandler]) -> None:
        self.app = app
        self.handlers = handlers  # (api base path, operationId) → handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        routing = scope.get("extensions", {}).get("connexion_routing")
        handler = routing and self.handlers.get((routing["api_base_path"], routing["operation_id"]))
        if not handler:
            await self.app(scope, receive, send)
            return
        response = await handler(scope)
        await response(scope, receive, send)
