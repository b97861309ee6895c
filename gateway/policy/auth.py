"""Authentication hooks named by the specs' security schemes (x-bearerInfoFunc / x-apikeyInfoFunc).

With no keys configured the gateway is open: `open_access_security_map` replaces
Connexion's handlers so that requests without credentials are admitted.
"""

from __future__ import annotations

from typing import Any

from connexion.security import AbstractSecurityHandler

ANONYMOUS = {"sub": "anonymous"}


def bearer_info(token: str, request: Any = None) -> dict[str, Any] | None:
    return ANONYMOUS


def api_key_info(key: str, required_scopes: Any = None, request: Any = None) -> dict[str, Any]:
    return ANONYMOUS


class OpenAccess(AbstractSecurityHandler):
    """Admits every request, with or without credentials."""

    def get_fn(self, security_scheme: dict[str, Any], required_scopes: Any) -> Any:
        async def admit(request: Any) -> dict[str, Any]:
            return ANONYMOUS

        return admit


def open_access_security_map() -> dict[str, type[AbstractSecurityHandler]]:
    return {"bearer": OpenAccess, "apiKey": OpenAccess, "basic": OpenAccess}
