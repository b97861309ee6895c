"""ASGI entry point for uvicorn (`gateway.asgi:create`, a factory): serves the config file
CHATGATE_CONFIG names, with the access log when CHATGATE_ACCESS_LOG is "1"."""

from __future__ import annotations

import sys

from starlette.types import ASGIApp

from gateway.app import create_app
from gateway.config.settings import ConfigError
from gateway.config.source import load_from_environment
from gateway.telemetry.access_log import AccessLog


def create() -> ASGIApp:
    try:
        settings = load_from_environment()
        return create_app(settings, AccessLog.to(sys.stdout if settings.environment.access_log else None))
    except ConfigError as error:  # say what is wrong, not a traceback
        print(f"chatgate: {error}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
