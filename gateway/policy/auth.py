"""Who is calling: API keys, stored as SHA-256 hashes and compared in constant time, presented
the ways each operation's document says (its security schemes: a Bearer token, an `api-key`
header …). The gateway is open only when the settings say so (no keys and no keys file, or
`auth: none`); one that requires keys and has none left refuses every request."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from gateway.config.settings import Key
from gateway.core.errors import Unauthorized

KEY_PREFIX = "cg-"


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

    @property
    def identity(self) -> str:
        """Who owns what this key stores (its hash; empty without keys): stable across renames."""
        return self.key.sha256 if self.key else ""

    def may_use(self, deployment: str) -> bool:
        return self.key is None or "*" in self.key.deployments or deployment in self.key.deployments


ANONYMOUS = Caller(None)


class KeyStore:
    def __init__(self, keys: list[Key], required: bool | None = None) -> None:
        """`required`: whether every request needs a key (default: when there are keys)."""
        self.keys = [(bytes.fromhex(k.sha256), k) for k in keys]
        self.required = bool(keys) if required is None else required

    @property
    def enabled(self) -> bool:
        return self.required

    def find(self, presented: str) -> Key | None:
        """The key whose hash matches; every stored hash is compared, in constant time."""
        presented_digest = digest(presented)
        found = None
        for stored_digest, key in self.keys:
            if hmac.compare_digest(stored_digest, presented_digest):
                found = key
        return found


def expired(key: Key) -> bool:
    return key.expires is not None and key.expires <= datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class Scheme:
    """Where an operation's document says a key is presented."""

    header: str  # lower-case
    bearer: bool  # `Authorization: Bearer <key>` rather than the bare key


def schemes_of(document: Mapping[str, Any], operation: Mapping[str, Any]) -> tuple[Scheme, ...]:
    """The key-bearing schemes an operation accepts (none: it is public)."""
    required = operation.get("security", document.get("security")) or []
    defined = document.get("components", {}).get("securitySchemes", {})
    found = []
    for alternative in required:
        for name in alternative:
            scheme = defined[name]
            if scheme.get("type") == "http" and scheme.get("scheme", "").lower() == "bearer":
                found.append(Scheme("authorization", bearer=True))
            elif scheme.get("type") == "apiKey" and scheme.get("in") == "header":
                found.append(Scheme(scheme["name"].lower(), bearer=False))
    return tuple(dict.fromkeys(found))


def authenticate(store: KeyStore, schemes: tuple[Scheme, ...], headers: Mapping[str, str]) -> Caller:
    """The caller of a request, or Unauthorized. Open when the operation is public or there are
    no keys."""
    if not schemes or not store.enabled:
        return ANONYMOUS
    problem = "No authorization token provided"
    for scheme in schemes:
        presented = headers.get(scheme.header)
        if presented is None:
            continue
        if scheme.bearer:
            kind, _, presented = presented.partition(" ")
            presented = presented.strip()
            if kind.lower() != "bearer" or not presented:
                problem = "Invalid authorization header"
                continue
        if key := store.find(presented):
            if not expired(key):
                return Caller(key)
            problem = "Provided key has expired"
            continue
        problem = "Provided key is not valid"
    raise Unauthorized(problem)
