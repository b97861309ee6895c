"""The seam between the chat flow and a dialect: what gateway/chat.py and the front door use of a
dialect's translator, and nothing more. A translator reads the dialect's request into the one
canonical request and renders canonical events back in the dialect's shapes: a whole answer, a
stream's payloads, an error. OpenAI-shaped dialects implement it through `OpenAIShaped`
(gateway/dialects/shape.py); a dialect of another shape implements it directly.

A stream is one `new_stream_state()` and one `chunks` call per canonical event, in order. The
events' own order is the backends' contract (backends/base.py): an answer's events end with one
`Usage`, after every choice's `Finish`; so a translator writes what opens its stream with the
first event it renders (its state says whether it has) and what closes it with the `Usage`.
Events that carry `frames` come from an upstream that spoke the translator's own dialect (a
native pass-through, backends/native_stream.py): only a translator of that dialect sees them,
and writes the frames as they came.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import orjson

from gateway.core.canonical import ChatRequest, Completion, Event
from gateway.core.errors import GatewayError
from gateway.dialects.defaults import Default
from gateway.dialects.framing import Framing
from gateway.dialects.rules import Rule

JSON = "application/json"


@dataclass(frozen=True, slots=True)
class DocumentFacts:
    """What a translator takes from its dialect's document, once, at start."""

    fields: frozenset[str]  # the parameters a chat body may hold
    unsupported: Mapping[str, str] = field(default_factory=dict)  # name → "ignored" | "rejected"
    rules: tuple[Rule, ...] = ()  # the document's `x-chatgate-rules` (gateway/dialects/rules.py)
    # the fields that declare a default, themselves or in their members (gateway/dialects/defaults.py)
    defaults: Mapping[str, Default] = field(default_factory=dict)


@dataclass(slots=True)
class Answer:
    """What every body of one answer shares."""

    id: str
    created: int
    model: str
    request: ChatRequest


@dataclass(slots=True)
class RenderedError:
    status: int
    body: Mapping[str, Any]
    headers: dict[str, str]

    def json(self) -> bytes:
        return orjson.dumps(self.body)


StateT = TypeVar("StateT")


class Translator(Protocol[StateT]):
    """A dialect's translator, typed by the state its stream keeps between events."""

    @property
    def framing(self) -> Framing:
        """How its stream is written (gateway/dialects/framing.py)."""

    @property
    def id_prefix(self) -> str:
        """What its answers' ids begin with (`chatcmpl-`, `msg_`, …)."""

    def read(self, body: Any, /) -> ChatRequest:
        """A chat body its document validated → the canonical request (a GatewayError refuses it)."""

    def completion(self, answer: Answer, completion: Completion, /) -> Any:
        """A whole answer's body."""

    def new_stream_state(self) -> StateT:
        """What one stream's translation remembers between events, fresh."""

    def chunks(self, answer: Answer, event: Event, state: StateT, /) -> list[Any]:
        """The payloads one canonical event becomes in the stream (often one, sometimes none)."""

    def error(self, error: GatewayError, request_id: str, /) -> RenderedError:
        """A gateway error as the dialect answers it over HTTP: status, body and headers."""

    def stream_error(self, error: GatewayError, request_id: str, state: StateT, /) -> Any:
        """An error after the stream began, as the payload the dialect's stream ends with."""


# How a dialect's translator is made: from its document's facts, once, at start (a translator
# class is one).
TranslatorFactory = Callable[[DocumentFacts], Translator[Any]]
