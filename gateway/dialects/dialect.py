"""A dialect's code as the gateway loads it: its document, its translator, which operations the
chat pipeline answers, the handlers of the others and the probe set that probes it (where it
mounts by default is data, in the registry `gateway.dialects`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from starlette.responses import Response

from gateway.core.canonical import ChatRequest
from gateway.dialects.translator import Answer, Translator, TranslatorFactory

# What a dialect's own operations (models, info, ping) may see of the gateway, as protocols: a
# dialect module imports no part of the runtime, so the dialects' code stands below everything
# that serves (gateway.http.call.Call and gateway.runtime.Runtime fit these).


class KeyHolder(Protocol):
    def may_use(self, deployment: str, /) -> bool: ...
    @property
    def identity(self) -> str:
        """Who owns what the key stores: its hash, or empty without keys."""


class OperationCall(Protocol):
    """One request to an operation: its headers (lower-case names), path parameters and caller."""

    @property
    def headers(self) -> dict[str, str]: ...
    @property
    def path_params(self) -> dict[str, str]: ...
    @property
    def query(self) -> dict[str, str]: ...
    @property
    def body(self) -> Any: ...
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


class ResponseStore(Protocol):
    """Records kept per owner (a key's identity), as JSON-able values: the Responses API's stored
    responses (gateway/policy/response_store.py). Another owner's record is as absent."""

    async def get(self, owner: str, record_id: str, /) -> Any | None: ...
    async def put(self, owner: str, record_id: str, record: Any, /) -> None: ...
    async def delete(self, owner: str, record_id: str, /) -> bool: ...


class ModelDirectory(Protocol):
    """The deployments served now (replaced on reload), when the gateway started, and the
    responses it stores."""

    @property
    def started(self) -> int: ...
    @property
    def router(self) -> Deployments: ...
    @property
    def responses(self) -> ResponseStore: ...


Handler = Callable[[OperationCall], Awaitable[Response]]


class ChatHook(Protocol):
    """What a chat operation does around the chat flow beyond translating (the Responses API
    reads a stored conversation before admission and stores the answer after it ended)."""

    async def before(self, call: OperationCall, request: ChatRequest, /) -> None:
        """Before admission: the request may grow (a stored history put before its input)."""

    async def answered(self, call: OperationCall, answer: Answer, body: Any, /) -> None:
        """After a whole answer's body was written."""

    async def streamed(self, call: OperationCall, answer: Answer, state: Any, /) -> None:
        """After a stream ended well, with its translation's last state."""


@dataclass(frozen=True, slots=True)
class OwnChat:
    """A chat operation answered with a translator of its own, made from the facts of its own
    body schema (the dialect's translator answers its other chat operations), and a hook."""

    translator: TranslatorFactory
    hook: Callable[[ModelDirectory, Translator[Any]], ChatHook] | None = None
    # the probe set (gateway.probes.sets) it is probed with, by the name `chatgate probe
    # --dialect` takes, under its dialect's mount
    probes: str | None = None


def no_operations(directory: ModelDirectory, translator: Translator[Any]) -> dict[str, Handler]:
    return {}


@dataclass(frozen=True, slots=True)
class Dialect:
    name: str
    document: str  # its file in openapi/
    translator: TranslatorFactory  # its translator's class (gateway/dialects/translator.py)
    chat_operations: tuple[str, ...]  # the operationIds the chat pipeline answers
    # chat operations with a translator of their own, by operationId (the Responses API's)
    own_chat: Mapping[str, OwnChat] = field(default_factory=dict)
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
