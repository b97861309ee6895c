"""ASGI entry point for uvicorn (`gateway.asgi:create`, a factory): reads CHATGATE_CONFIG."""

from __future__ import annotations

import os
import sys

from starlette.types import ASGIApp

from gateway.access_log import AccessLog
from gateway.app import create_app
from gateway.config import ConfigError
from gateway.config_source import load_settings


def create() -> ASGIApp:
    try:
        settings = load_settings(os.environ.get("CHATGATE_CONFIG") or None)
        return create_app(settings, AccessLog.from_environment())
    except ConfigError as error:  # say what is wrong, not a traceback
        print(f"chatgate: {error}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
