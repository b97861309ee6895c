"""Backends: one interface (`Backend`), one implementation per kind of model server."""

from backends.base import Backend, Capabilities, create_backend

__all__ = ["Backend", "Capabilities", "create_backend"]
