"""Which dialect renders an error for a path that no operation answered: the dialect mounted at
the longest prefix holding it, else the fallback. Known before the server starts, so the
connection layer (gateway/server/edge.py) renders its own errors with it too, not only the front door,
and tells the front door of each, which records it as it records every answer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.core.errors import GatewayError, error_for_status
from gateway.dialects.translator import Translator

JSON_MEDIA_TYPE = b"application/json"


class ErrorDialects:
    def __init__(self, mounted: list[tuple[str, Translator[Any]]], fallback: Translator[Any]) -> None:
        prefixes = [(mount.rstrip("/"), translator) for mount, translator in mounted]
        self.mounts = sorted(prefixes, key=lambda pair: len(pair[0]), reverse=True)  # longest first
        self.fallback = fallback  # renders errors off every mount
        # told of each error the connection answers (path, error, status sent): the front door's record
        self.edge_answered: Callable[[str, GatewayError, int], None] | None = None

    def translator_for(self, path: str) -> Translator[Any]:
        for prefix, translator in self.mounts:
            if not prefix or path == prefix or path.startswith(prefix + "/"):
                return translator
        return self.fallback

    def edge_error(self, status: int, message: str, path: str) -> tuple[bytes, bytes]:
        """An error the connection itself answers (gateway/server/edge.py), in the path's dialect."""
        error = error_for_status(status, message)
        rendered = self.translator_for(path).error(error, "")
        if self.edge_answered is not None:
            self.edge_answered(path, error, rendered.status)
        return rendered.json(), JSON_MEDIA_TYPE
