"""Who is calling: API keys, stored as SHA-256 hashes and compared in constant time.

The specs' security schemes name `bearer_info` / `api_key_info` (x-bearerInfoFunc,
x-apikeyInfoFunc); Connexion calls them with the presented credential. With no keys
configured the gateway is open: `open_access_security_map` makes Connexion admit requests
that carry no credentials at all.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Any

from connexion.exceptions import OAuthProblem, OAuthResponseProblem
from connexion.security import NO_VALUE, AbstractSecurityHandler

from gateway.config import Key

KEY_STORE_SCOPE_KEY = "chatgate.keys"
KEY_PREFIX = "cg-"
ANONYMOUS = {"sub": "anonymous", "key": None}


def digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def new_key() -> tuple[str, str]:
    """A fresh key and its hex SHA-256 (the only form that goes into config)."""
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    return key, digest(key).hex()


@dataclass(frozen=True, slots=True)
class Caller:
    key: Key | None

    @property
    def name(self) -> str:
        return self.key.name if self.key else "anonymous"

    def may_use(self, deployment: str) -> bool:
        return self.key is None or "*" in self.key.deployments or deployment in self.key.deployments


class KeyStore:
    def __init__(self, keys: list[Key]) -> None:
        self.keys = [(bytes.fromhex(k.sha256), k) for k in keys]

    @property
    def enabled(self) -> bool:
        return bool(self.keys)

    def find(self, presented: str) -> Key | None:
        """The key whose hash matches; every stored hash is compared, in constant time."""
        presented_digest = digest(presented)
        found = None
        for stored_digest, key in self.keys:
            if hmac.compare_digest(stored_digest, presented_digest):
                found = key
        return found


def caller_info(credential: str, request: Any) -> dict[str, Any] | None:
    store: KeyStore = request.scope[KEY_STORE_SCOPE_KEY]
    key = store.find(credential)
    return None if key is None else {"sub": key.name, "caller": Caller(key)}


def bearer_info(token: str, request: Any = None) -> dict[str, Any] | None:
    return caller_info(token, request)


def api_key_info(key: str, required_scopes: Any = None, request: Any = None) -> dict[str, Any] | None:
    return caller_info(key, request)


class BearerKeys(AbstractSecurityHandler):
    """`Authorization: Bearer <key>` checked against the key store.

    Does what Connexion's bearer handler does with `bearer_info`, without inspecting the
    hook's signature on every request.
    """

    def get_fn(self, security_scheme: dict[str, Any], required_scopes: Any) -> Any:
        async def check(request: Any) -> dict[str, Any]:
            value = request.headers.get("authorization")
            if not value:
                return NO_VALUE
            scheme, _, token = value.partition(" ")
            if scheme.lower() != "bearer" or not token:
                raise OAuthProblem(detail="Invalid authorization header")
            info = bearer_info(token.strip(), request)
            if info is None:
                raise OAuthResponseProblem(detail="Provided key is not valid")
            return info

        return check


class ApiKeyHeaderKeys(AbstractSecurityHandler):
    """The `api-key` header (Azure's) checked against the key store."""

    def get_fn(self, security_scheme: dict[str, Any], required_scopes: Any) -> Any:
        header = security_scheme["name"]

        async def check(request: Any) -> dict[str, Any]:
            key = request.headers.get(header)
            if key is None:
                return NO_VALUE
            info = api_key_info(key, request=request)
            if info is None:
                raise OAuthResponseProblem(detail="Provided key is not valid")
            return info

        return check


def keys_security_map() -> dict[str, type[AbstractSecurityHandler]]:
    return {"bearer": BearerKeys, "apiKey": ApiKeyHeaderKeys}


class OpenAccess(AbstractSecurityHandler):
    """Admits every request, with or without credentials (no keys are configured)."""

    def get_fn(self, security_scheme: dict[str, Any], required_scopes: Any) -> Any:
        async def admit(request: Any) -> dict[str, Any]:
            return {"sub": "anonymous", "caller": Caller(None)}

        return admit


def open_access_security_map() -> dict[str, type[AbstractSecurityHandler]]:
    return {"bearer": OpenAccess, "apiKey": OpenAccess, "basic": OpenAccess}
