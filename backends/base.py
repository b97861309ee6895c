"""The Backend interface: declared capabilities plus an async generator of canonical events."""

from __future__ import annotations

import importlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from gateway.canonical import ChatRequest, Event


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a backend (and the model behind it) can do; the policy layer reads this table."""

    modalities: frozenset[str] = frozenset({"text"})
    parameters: frozenset[str] = frozenset()
    response_formats: frozenset[str] = frozenset({"text"})
    max_n: int = 1
    max_top_logprobs: int = 0
    context_length: int = 8192


class Backend(Protocol):
    name: str
    capabilities: Capabilities

    def generate(self, request: ChatRequest) -> AsyncIterator[Event]:
        """Yield TextDelta / ToolCallDelta / Finish events, then one Usage event."""
        ...

    async def aclose(self) -> None: ...


BACKEND_KINDS: dict[str, str] = {
    "echo": "backends.echo:EchoBackend",
}


def create_backend(kind: str, model: str, options: dict[str, Any]) -> Backend:
    """Instantiate a backend by its kind name (import is lazy so optional extras stay optional)."""
    module_name, _, class_name = BACKEND_KINDS[kind].partition(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    return cls(model=model, **options)
