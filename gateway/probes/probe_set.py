"""The shape of a dialect's probe set: requests, and how each answer is judged. A dialect adds
its probes by writing a `ProbeSet` (see `openai.py`, `azure.py`, …) and naming it in
`sets.PROBE_SETS`; the features its document does not have are named in `absent`, with why."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.probes.findings import Verdict

Judgement = tuple[Verdict, str]


@dataclass(frozen=True, slots=True)
class Answer:
    """What came back for one probe request."""

    status: int = 0  # 0: no answer came (`failure` says why)
    body: Any = None  # a JSON answer, parsed (None when the body is not JSON)
    raw: bytes = b""
    streamed: bool = False  # framed as a stream (its chunks in `chunks`)
    chunks: tuple[Any, ...] = ()  # a stream's chunks, parsed
    done: bool = False  # the stream ended with its end marker ([DONE])
    failure: str = ""
    transport_failed: bool = False  # no answer because the connection failed (not a timeout)
    first_failure: str = ""  # the transport's failure the first time it was asked (then again)
    media_type: str = ""  # a stream's Content-Type, without parameters


Judge = Callable[[list[Answer]], Judgement]


def first_of(body: Any, key: str, name: str) -> Any:
    """`body[key][0][name]` (`key` empty: `body[0][name]`), or None where the body has none."""
    items = body.get(key) if key and isinstance(body, dict) else body
    head = items[0] if isinstance(items, list) and items else None
    return head.get(name) if isinstance(head, dict) else None


@dataclass(frozen=True, slots=True)
class Probe:
    """One feature: the requests that try it (the model is added to each) and the judge of
    their answers. Unless `any_status`, an answer that is not a 2xx is judged before the judge
    sees it: a 4xx is `refused`, anything else `broken`."""

    feature: str
    bodies: tuple[dict[str, Any], ...]
    judge: Judge
    any_status: bool = False
    keyless: bool = False  # sent without the key (to see whether one is asked for)


@dataclass(frozen=True, slots=True)
class Listing:
    """Where a dialect names the models a server serves: the operation of its document that
    lists them (by operationId: its path is read from the document) and the first model's name
    in its answer (None when the answer names none)."""

    operation: str
    name_of: Callable[[Any], Any]
    query: Mapping[str, str] = field(default_factory=dict)  # parameters the operation needs


@dataclass(frozen=True, slots=True)
class ProbeSet:
    dialect: str
    path: str  # of the chat operation, below the base URL
    plain: dict[str, Any]  # a request every server answers: when it fails, nothing can be probed
    probes: tuple[Probe, ...]
    error_message: Callable[[bytes], str]  # an error body's words, for a refusal's detail
    absent: Mapping[str, str] = field(default_factory=dict)  # feature → why it is not probed
    listing: Listing | None = None  # None: the dialect's document lists no models (name one)

    def gate(self, answer: Answer) -> Judgement | None:
        """The verdict of an answer that is not a usable 2xx; None for one the judge reads."""
        if answer.status == 0:
            return "broken", answer.failure
        if answer.status == 429:
            return "broken", "HTTP 429: rate limited, try again later"
        if 400 <= answer.status < 500:
            return "refused", f"HTTP {answer.status}: {self.error_message(answer.raw)}"
        if not 200 <= answer.status < 300:
            return "broken", f"HTTP {answer.status}"
        if answer.body is None and not answer.streamed:
            return "broken", f"the answer is not JSON: {answer.raw[:120]!r}"
        return None
