"""A dialect as the gateway registers it: its document, its translator, where it mounts by
default, which operations the chat pipeline answers and the handlers of the others."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from starlette.responses import Response

from gateway.dialects.shape import OpenAIShaped

if TYPE_CHECKING:
    from gateway.call import Call
    from gateway.runtime import Runtime

Handler = Callable[["Call"], Awaitable[Response]]


def no_operations(runtime: Runtime, translator: OpenAIShaped) -> dict[str, Handler]:
    return {}


@dataclass(frozen=True, slots=True)
class Dialect:
    name: str
    document: str  # its file in openapi/
    default_mount: str
    translator: type[OpenAIShaped]
    chat_operations: tuple[str, ...]  # the operationIds the chat pipeline answers
    # the handlers of its other operations, by operationId
    operations: Callable[[Runtime, OpenAIShaped], dict[str, Handler]] = no_operations
    routing_header: str | None = None  # a header that names the deployment (Azure's)
    # images named by URL or path are screened by the gateway's media policy before any backend
    # (OVMS's three forms: gateway/policy/media.py); else they are passed on as sent
    screens_media: bool = False
