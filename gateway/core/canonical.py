"""The one canonical chat request and the events a backend yields, shared by every dialect."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from enum import Enum
from itertools import pairwise
from typing import Any, Literal

from gateway.core.errors import BadGateway
from gateway.core.trace import Trace

# Canonical finish reasons; each dialect maps them to its own words.
FinishReason = Literal["stop", "stop_sequence", "length", "tool_calls", "content_filter"]


@dataclass(slots=True)
class ChatRequest:
    """A chat request after its dialect adapter has read it.

    `messages` keep the OpenAI message shape, which every dialect here shares.
    `options` holds dialect-specific sampling parameters that the dialect's spec
    defines (top_k, ignore_eos, best_of …); `extra` holds parameters the spec does
    not define and the extra-parameters policy let through.
    """

    model: str | None
    messages: list[dict[str, Any]]
    stream: bool = False
    include_usage: bool = False
    n: int = 1
    max_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    logprobs: bool = False
    top_logprobs: int = 0
    response_format: dict[str, Any] | None = None
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_choice: str | dict[str, Any] | None = None
    user: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    # The parameters (canonical names) the body set only to its document's declared defaults:
    # they ask for nothing, so no capability check refuses them (gateway/core/parameters.py,
    # `unasked`), and a backend that takes them is still sent them.
    defaulted: frozenset[str] = frozenset()
    deployment: str | None = None
    trace: Trace = field(default_factory=Trace)  # ids sent upstream, and the upstream's
    # The prompt's size as admission counted it (the deployment's tokenizer, else the
    # estimate): what a backend reports when its upstream says nothing of usage.
    prompt_tokens: int = 0
    # The client asked in OpenAI's deprecated `functions` / `function_call` (and sent no
    # `tools`): a call is answered as `function_call`, as that client reads it.
    legacy_functions: bool = False
    # What the dialect read and dropped, having no meaning on any backend here (Anthropic's
    # `thinking` and `cache_control`, the Responses API's hosted tools …): named in the answer's
    # x-chatgate-dropped-params with the extra parameters, never silent.
    dropped: list[str] = field(default_factory=list)
    # What the dialect's translator keeps of the body to write its answers with (the Responses
    # API echoes its request in every response): its own, read by nothing else.
    echo: Any = None
    # The body as the client sent it in its own dialect, for a deployment whose upstream speaks
    # that dialect too (a native pass-through): its `dialect` is one the backends name
    # (`messages`, `responses`). Not a reading of the body, so not compared.
    native: NativeBody | None = field(default=None, compare=False)


@dataclass(slots=True)
class NativeBody:
    """A chat body in the client's own dialect, sent upstream as it came (a backend whose
    upstream speaks the dialect sets the model, the policy's edits and `stream`)."""

    dialect: Literal["messages", "responses"]
    body: dict[str, Any]
    extra: frozenset[str] = frozenset()  # its fields the document does not define


class FromToken(Enum):
    """A logprob entry's `bytes` the backend did not give: each dialect derives them from the
    token text, its own way (UTF-8, code points)."""

    FROM_TOKEN = "from token"


FROM_TOKEN = FromToken.FROM_TOKEN
# A token's bytes as the backend gave them: a list, None (it said null: the token has no byte
# form, such as a special token), or FROM_TOKEN.
TokenBytes = list[int] | None | FromToken


@dataclass(slots=True)
class TopLogprob:
    token: str
    logprob: float
    bytes: TokenBytes = FROM_TOKEN


@dataclass(slots=True)
class TokenLogprob:
    token: str
    logprob: float | None  # None when the backend could not say
    top: list[TopLogprob] = field(default_factory=list)
    bytes: TokenBytes = FROM_TOKEN


@dataclass(slots=True)
class TextDelta:
    """A piece of generated text for choice `index` (one or more tokens). `last`: the choice's
    last text, its Finish the very next event (a backend that knows says so, and a dialect
    that puts the finish reason on the last token's chunk, LMI, does so without waiting)."""

    index: int
    text: str
    logprobs: list[TokenLogprob] | None = None
    last: bool = False
    # The upstream's own frames this event stands for, when the upstream spoke the client's
    # dialect (a native pass-through: the dialect writes them as they came); None: made here.
    frames: list[Any] | None = None


@dataclass(slots=True)
class RefusalDelta:
    """A piece of the refusal the model gave instead of an answer, for choice `index` (OpenAI's
    `refusal`, whole or streamed), with the logprobs of its tokens when asked for."""

    index: int
    text: str
    logprobs: list[TokenLogprob] | None = None
    # The upstream's own frames this event stands for, when the upstream spoke the client's
    # dialect (a native pass-through: the dialect writes them as they came); None: made here.
    frames: list[Any] | None = None


@dataclass(slots=True)
class ToolCallDelta:
    """A tool call for choice `index`; backends send each call whole."""

    index: int
    call_index: int
    id: str
    name: str
    arguments: str
    # The upstream's own frames this event stands for, when the upstream spoke the client's
    # dialect (a native pass-through: the dialect writes them as they came); None: made here.
    frames: list[Any] | None = None


@dataclass(slots=True)
class Finish:
    """A choice's end. `stop`: the stop string that ended it (with reason `stop_sequence`), when
    the backend knows which (Anthropic's `stop_sequence` names it)."""

    index: int
    reason: FinishReason
    stop: str | None = None
    # The upstream's own frames this event stands for, when the upstream spoke the client's
    # dialect (a native pass-through: the dialect writes them as they came); None: made here.
    frames: list[Any] | None = None


@dataclass(frozen=True, slots=True)
class CompletionTokensDetails:
    """What the completion tokens were spent on, as far as the backend said (None: not said)."""

    accepted_prediction_tokens: int | None = None
    audio_tokens: int | None = None
    reasoning_tokens: int | None = None
    rejected_prediction_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class PromptTokensDetails:
    """What the prompt tokens were made of, as far as the backend said (None: not said)."""

    audio_tokens: int | None = None
    cached_tokens: int | None = None


@dataclass(slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    completion_tokens_details: CompletionTokensDetails | None = None
    prompt_tokens_details: PromptTokensDetails | None = None
    # The upstream's own frames this event stands for, when the upstream spoke the client's
    # dialect (a native pass-through: the dialect writes them as they came); None: made here.
    frames: list[Any] | None = None

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(slots=True)
class ServedBy:
    """What the backend said about the answer as a whole: the configuration that produced it
    (`system_fingerprint`) and the tier that served it (`service_tier`). Sent before the first
    text when the backend knows it then (an upstream says it in every chunk)."""

    system_fingerprint: str | None = None
    service_tier: str | None = None
    # The upstream's own frames this event stands for, when the upstream spoke the client's
    # dialect (a native pass-through: the dialect writes them as they came); None: made here.
    frames: list[Any] | None = None


@dataclass(slots=True)
class Passed:
    """Upstream frames in the client's own dialect with no canonical meaning (a native
    pass-through: its message's start, a block's start, a thinking delta, a ping …), written as
    they came by the dialect that speaks them and by no other."""

    frames: list[Any]


Event = TextDelta | RefusalDelta | ToolCallDelta | Finish | Usage | ServedBy | Passed
# What a backend yields: one event, or a batch of events it has at once (a whole completion,
# an upstream chunk's several events), never empty. A batch passes every layer in one step:
# per item, not per event, is what the async generators between a backend and a client cost.
Batch = list[Event]
Item = Event | Batch
# What a backend's `generate` returns: an async generator, so whoever stops early can close it
# (and the backend hangs up on its upstream).
EventStream = AsyncGenerator[Item, None]


def each(item: Item) -> Batch:
    """An item's events."""
    return item if isinstance(item, list) else [item]


@dataclass(slots=True)
class Choice:
    """One choice gathered from the events of a non-streamed completion."""

    index: int
    text: str = ""
    logprobs: list[TokenLogprob] | None = None
    tool_calls: list[ToolCallDelta] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    refusal: str | None = None  # None: the model did not refuse
    refusal_logprobs: list[TokenLogprob] | None = None
    stop_sequence: str | None = None  # the stop string that ended it, when known


@dataclass(slots=True)
class Completion:
    choices: list[Choice]
    usage: Usage
    served: ServedBy = field(default_factory=ServedBy)


# Bytes a logprob entry takes in a rendered answer besides its token (JSON keys, the number,
# the token's `bytes` list): an estimate, close enough to bound an answer before it is built.
LOGPROB_ENTRY_BYTES = 64


def rendered_size(event: Event) -> int:
    """About how many bytes an event adds to a rendered answer."""
    if isinstance(event, TextDelta | RefusalDelta):
        size = len(event.text)
        if event.logprobs:
            for entry in event.logprobs:
                size += LOGPROB_ENTRY_BYTES + 4 * len(entry.token)
                for top in entry.top:
                    size += LOGPROB_ENTRY_BYTES + 4 * len(top.token)
        return size
    if isinstance(event, ToolCallDelta):
        return len(event.arguments) + len(event.name) + len(event.id)
    return 0


def part_text(part: Any) -> str:
    """A content part's words: a text part's `text`, a refusal part's `refusal`, else nothing.
    Only the field its type defines is read, and only a string: under `extra-parameters:
    pass-through` a part may carry any undefined field of any type (a text part's `refusal: [1]`)."""
    if not isinstance(part, dict):
        return ""
    kind = part.get("type")
    value = part.get("text") if kind == "text" else part.get("refusal") if kind == "refusal" else None
    return value if isinstance(value, str) else ""


def content_text(content: Any, separator: str = " ") -> str:
    """A message's `content` as text: a string as it is, a list by its parts' words."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return separator.join(part_text(part) for part in content)
    return ""


def prompt_text(messages: list[dict[str, Any]]) -> str:
    """The text of the messages, joined by newlines (text parts of a list content too)."""
    texts = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            texts += [part_text(part) for part in content if isinstance(part, dict)]
    return "\n".join(texts)


def mark_last_text(events: list[Event]) -> list[Event]:
    """The events, each TextDelta directly followed by its choice's Finish marked `last`."""
    if len(events) < 2:  # most of a stream's chunks: one event
        return events
    for event, following in pairwise(events):
        if isinstance(event, TextDelta) and isinstance(following, Finish) and following.index == event.index:
            event.last = True
    return events


async def gather(items: AsyncIterator[Item], max_bytes: int | None = None) -> Completion:
    """Fold a backend's event stream into a whole completion, refusing to hold more than
    about `max_bytes` of it."""
    folded = Folded(max_bytes)
    async for item in items:
        folded.add_item(item)
    return folded.completion()


class Folded:
    """A completion being gathered, event by event: a choice for each index the events name,
    none other (a choice nothing was said of is not invented)."""

    __slots__ = ("choices", "max_bytes", "refusals", "served", "size", "texts", "usage")

    def __init__(self, max_bytes: int | None = None) -> None:
        self.max_bytes = max_bytes
        self.size = 0
        self.choices: dict[int, Choice] = {}
        self.texts: dict[int, list[str]] = {}
        self.refusals: dict[int, list[str]] = {}
        self.usage = Usage(0, 0)
        self.served = ServedBy()

    def choice(self, index: int) -> Choice:
        choice = self.choices.get(index)
        if choice is None:
            choice = self.choices[index] = Choice(index=index)
            self.texts[index] = []
        return choice

    def add_item(self, item: Item) -> None:
        for event in item if isinstance(item, list) else (item,):
            if self.max_bytes is not None:
                self.size += rendered_size(event)
                if self.size > self.max_bytes:
                    raise answer_too_large(self.max_bytes)
            self.add(event)

    def add(self, event: Event) -> None:
        match event:
            case TextDelta(index=i, text=text, logprobs=logprobs):
                choice = self.choice(i)
                self.texts[i].append(text)
                if logprobs is not None:
                    if choice.logprobs is None:
                        choice.logprobs = []
                    choice.logprobs.extend(logprobs)
            case RefusalDelta(index=i, text=text, logprobs=logprobs):
                choice = self.choice(i)
                self.refusals.setdefault(i, []).append(text)
                if logprobs is not None:
                    choice.refusal_logprobs = [*(choice.refusal_logprobs or ()), *logprobs]
            case ToolCallDelta(index=i):
                self.choice(i).tool_calls.append(event)
            case Finish(index=i, reason=reason, stop=stop):
                choice = self.choice(i)
                choice.finish_reason, choice.stop_sequence = reason, stop
            case Usage():
                self.usage = event
            case ServedBy():
                self.served = ServedBy(
                    event.system_fingerprint or self.served.system_fingerprint,
                    event.service_tier or self.served.service_tier,
                )

    def completion(self) -> Completion:
        choices = [self.choices[index] for index in sorted(self.choices)]
        for choice in choices:
            choice.text = "".join(self.texts[choice.index])
            refused = self.refusals.get(choice.index)
            choice.refusal = None if refused is None else "".join(refused)
        return Completion(choices=choices, usage=self.usage, served=self.served)


def answer_too_large(limit: int) -> BadGateway:
    return BadGateway(
        f"The answer is larger than the gateway relays ({limit} bytes); ask for less "
        "(max_tokens, n, top_logprobs).",
        code="ResponseTooLarge",
    )
