"""A dialect's code as the gateway loads it: its document, its translator, which operations the
chat pipeline answers, the handlers of the others and the probe set that probes it (where it
mounts by default is data, in the registry `gateway.dialects`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from starlette.responses import Response

from gateway.dialects.translator import Translator, TranslatorFactory

# What a dialect's own operations (models, info, ping) may see of the gateway, as protocols: a
# dialect module imports no part of the runtime, so the dialects' code stands below everything
# that serves (gateway.http.call.Call and gateway.runtime.Runtime fit these).


class KeyHolder(Protocol):
    def may_use(self, deployment: str, /) -> bool: ...


class OperationCall(Protocol):
    """One request to an operation: its headers (lower-case names), path parameters and caller."""

    @property
    def headers(self) -> dict[str, str]: ...
    @property
    def path_params(self) -> dict[str, str]: ...
    @property
    def caller(self) -> KeyHolder: ...


class ServedDeployment(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def model(self) -> str: ...
    @property
    def provider(self) -> str: ...


class Deployments(Protocol):
    def model_names(self, visible: Callable[[str], bool], /) -> list[str]: ...
    def route(self, model: str | None, deployment_name: str | None = None, /) -> ServedDeployment: ...


class ModelDirectory(Protocol):
    """The deployments served now (replaced on reload) and when the gateway started."""

    @property
    def started(self) -> int: ...
    @property
    def router(self) -> Deployments: ...


Handler = Callable[[OperationCall], Awaitable[Response]]


def no_operations(directory: ModelDirectory, translator: Translator[Any]) -> dict[str, Handler]:
    return {}


@dataclass(frozen=True, slots=True)
class Dialect:
    name: str
    document: str  # its file in openapi/
    translator: TranslatorFactory  # its translator's class (gateway/dialects/translator.py)
    chat_operations: tuple[str, ...]  # the operationIds the chat pipeline answers
    # the handlers of its other operations, by operationId
    operations: Callable[[ModelDirectory, Translator[Any]], dict[str, Handler]] = no_operations
    routing_header: str | None = None  # a header that names the deployment (Azure's)
    # images named by URL or path are screened by the gateway's media policy before any backend
    # (OVMS's three forms: gateway/policy/media.py); else they are passed on as sent
    screens_media: bool = False
    # the probe set its chat operation is probed with (`chatgate probe`, `chatgate conformance`),
    # by name in gateway.probes.sets: its own, or that of a dialect whose shape it shares; None:
    # not probed (the commands say so)
    probes: str | None = None
