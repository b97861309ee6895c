"""ASGI entry point for uvicorn (`gateway.asgi:create`, a factory): reads CHATGATE_CONFIG."""

from __future__ import annotations

import os

from starlette.types import ASGIApp

from gateway.app import create_app
from gateway.config import load_settings


def create() -> ASGIApp:
    return create_app(load_settings(os.environ.get("CHATGATE_CONFIG") or None))
