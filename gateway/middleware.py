"""The outermost ASGI layer: a request id on every response (the client's, or a fresh one),
and the key store where the auth hooks named by the specs can find it."""

from __future__ import annotations

import re
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.dialects.base import REQUEST_ID_SCOPE_KEY
from gateway.policy.auth import KEY_STORE_SCOPE_KEY, KeyStore

REQUEST_ID_HEADER = b"x-request-id"
SAFE_REQUEST_ID = re.compile(rb"^[A-Za-z0-9._:/+=-]{1,200}$")


class GatewayMiddleware:
    def __init__(self, app: ASGIApp, key_store: KeyStore) -> None:
        self.app = app
        self.key_store = key_store

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
            request_id = uuid.uuid4().hex.encode()
        scope[REQUEST_ID_SCOPE_KEY] = request_id.decode()
        scope[KEY_STORE_SCOPE_KEY] = self.key_store

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), (REQUEST_ID_HEADER, request_id)]
            await send(message)

        await self.app(scope, receive, send_with_id)
