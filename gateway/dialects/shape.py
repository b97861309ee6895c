"""The translator every OpenAI-shaped dialect is made from (one implementation of
`gateway.dialects.translator.Translator`): a chat body read by its document's fields into the one
canonical request, and canonical events rendered as completions, chunks and error bodies. A
dialect's translator says, as data or a small override, what its document says differently.
Everything here is pure: no I/O, no policy, no server.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Literal, TypeVar

import orjson

from gateway.core.canonical import (
    ChatRequest,
    Choice,
    Completion,
    CompletionTokensDetails,
    Event,
    Finish,
    FinishReason,
    FromToken,
    PromptTokensDetails,
    RefusalDelta,
    ServedBy,
    TextDelta,
    TokenBytes,
    TokenLogprob,
    ToolCallDelta,
    TopLogprob,
    Usage,
)
from gateway.core.errors import BadRequest, GatewayError
from gateway.core.parameters import BY_SPELLING, canonical_name
from gateway.dialects.defaults import defaulted
from gateway.dialects.framing import SSE, Framing
from gateway.dialects.rules import first_breach
from gateway.dialects.text_pieces import TEXT_MARK, cut
from gateway.dialects.translator import Answer, DocumentFacts, RenderedError

if TYPE_CHECKING:  # the documents' shapes, for the type checker only (generated/, no run-time cost)
    from generated import openai as openai_doc

# A translator is typed by its dialect's document (generated/<dialect>.py): the request it reads,
# the completion, chunk, stream choice and error body it writes. mypy holds each dialect's keys
# to its own document, so a field renamed in openapi/ fails the type check (tests/system/test_types.py).
RequestT = TypeVar("RequestT", bound=Mapping[str, Any])
CompletionT = TypeVar("CompletionT")
ChunkT = TypeVar("ChunkT")
StreamChoiceT = TypeVar("StreamChoiceT")
ErrorT = TypeVar("ErrorT", bound=Mapping[str, Any])
# A part every OpenAI-shaped document shapes alike (a message, a delta, logprobs, usage), built
# once here for all dialects; the completion, chunk and choice that hold it are typed per dialect.
Shared = Any
# The names of the token limit, the first one given winning (OpenAI's newer name over its older
# one; Aleph Alpha's client's name last).
TOKEN_LIMITS = ("max_completion_tokens", "max_tokens", "maximum_tokens")


def integer_parameter(value: Any) -> Any:
    """An integer parameter as an int: a document that counts integers as JSON Schema 2020-12
    does admits 2.0 (gateway/http/validation.py, `x-chatgate-integers`)."""
    return int(value) if isinstance(value, float) else value


def usage_detail_counts(details: CompletionTokensDetails | PromptTokensDetails) -> dict[str, int]:
    """The counts of a usage detail the backend gave (those it did not say are left out)."""
    # not dataclasses.asdict: it deep-copies every value, a fifth of rendering an answer
    return {name: value for name in details.__slots__ if (value := getattr(details, name)) is not None}


def unsupported_parameter(name: str, value: Any) -> BadRequest:
    """A parameter the dialect itself refuses, whatever the model (400, as its document says)."""
    return BadRequest(
        f"The parameter '{name}' is not supported by this API.",
        param=name,
        loc=["body", name],
        value=value,
        code="UnsupportedParameter",
    )


@dataclass(slots=True)
class StreamState(Generic[ChunkT]):
    """What a stream's translation remembers between events."""

    started: set[int] = field(default_factory=set)  # choices whose first chunk went out
    served: ServedBy = field(default_factory=ServedBy)  # what the backend said of the answer
    held: dict[int, ChunkT] = field(default_factory=dict)  # a choice's chunk not yet sent
    # a choice's text piece framed, cut around its text (None: not cut), and the `served` it
    # was made with (OpenAIShaped.text_frame)
    texts: dict[int, tuple[tuple[bytes, ...] | None, ServedBy]] = field(default_factory=dict)


# When a stream ends with a usage-only chunk: when `include_usage` asks, always, or never.
UsageChunk = Literal["asked", "always", "never"]


class OpenAIShaped(Generic[RequestT, CompletionT, ChunkT, StreamChoiceT, ErrorT]):
    """OpenAI's chat completion shapes, with the knobs the other dialects turn. A knob says what
    the dialect's document has; a field the document lacks is never rendered. The bodies' outer
    keys (completion, chunk, stream choice, error) each dialect writes in its own document's
    types (`completion`, `chunk_body`, `chunk_choice`, `error_body`)."""

    framing: ClassVar[Framing] = SSE()
    id_prefix: ClassVar[str] = "chatcmpl-"
    # a begun choice's text pieces made from a template (`text_frame`): every chunk of such a
    # piece the same but for its text, whatever came before it
    text_templated: ClassVar[bool] = True
    # canonical finish reason → the dialect's word
    finish_reasons: ClassVar[Mapping[FinishReason, str]] = {
        "stop": "stop",
        "stop_sequence": "stop",
        "length": "length",
        "tool_calls": "tool_calls",
        "content_filter": "content_filter",
    }
    # what a token's logprob reads when the backend gave none: OpenAI's -9999.0 (its "outside
    # the top 20"; Aleph Alpha documents it too), or None where the document admits null
    missing_logprob: ClassVar[float | None] = -9999.0
    # whether a token's `bytes` may be null (a token with no byte form), else derived
    null_bytes: ClassVar[bool] = True
    # whether each choice's stream opens with a chunk that carries only the role (OpenAI does)
    separate_role_chunk: ClassVar[bool] = True
    # the delta of the chunk that carries a finish reason (some dialects require `content`)
    finish_delta: ClassVar[Mapping[str, Any]] = {}
    refusal_field: ClassVar[bool] = False  # `message.refusal` / `delta.refusal` (else: content)
    logprobs_refusal: ClassVar[bool] = False  # `logprobs.refusal`
    usage_details: ClassVar[bool] = False  # `usage.*_tokens_details`
    usage_chunk: ClassVar[UsageChunk] = "asked"

    def __init__(self, facts: DocumentFacts) -> None:
        self.facts = facts
        # each field that carries a parameter → the parameter's canonical name
        self.canonical_names = {name: canonical_name(name) for name in facts.fields}

    def new_stream_state(self) -> StreamState[ChunkT]:
        return StreamState()

    # ----- reading ---------------------------------------------------------------------------

    def read(self, body: RequestT) -> ChatRequest:
        """A validated chat body → the canonical request. Only the parameters the document
        defines are read; the others go to `extra`, untouched, for the extra-parameters policy."""
        screened = self.screen_unsupported(body)
        if (breach := first_breach(self.facts.rules, screened)) is not None:
            raise breach
        defined = self.facts.fields
        known: dict[str, Any] = {}
        options: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for name, value in screened.items():
            if name not in defined:
                extra[name] = value
                continue
            parameter = BY_SPELLING.get(name)
            if parameter is not None and parameter.field:
                known[name] = value
            elif value is not None:  # an option sent as null is not set
                options[name if parameter is None else parameter.name] = value
        request = self.canonical(known, options, extra)
        if self.facts.defaults:
            request.defaulted = defaulted(self.facts.defaults, screened, self.canonical_names)
        self.check(request)
        return request

    @staticmethod
    def canonical(known: dict[str, Any], options: dict[str, Any], extra: dict[str, Any]) -> ChatRequest:
        stop = known.get("stop")
        tools = list(known.get("tools") or [])
        tool_choice = known.get("tool_choice")
        legacy = bool(known.get("functions")) and not tools
        if known.get("functions"):  # legacy functions → tools
            tools += [{"type": "function", "function": f} for f in known["functions"]]
            legacy_choice = known.get("function_call")
            if isinstance(legacy_choice, dict):
                tool_choice = {"type": "function", "function": legacy_choice}
            elif legacy_choice is not None:
                tool_choice = legacy_choice
        limit = next((known[name] for name in TOKEN_LIMITS if known.get(name) is not None), None)
        max_tokens = integer_parameter(limit)
        return ChatRequest(
            model=known.get("model"),
            messages=known["messages"],
            stream=bool(known.get("stream")),
            include_usage=bool((known.get("stream_options") or {}).get("include_usage")),
            n=integer_parameter(known.get("n")) or 1,
            max_tokens=max_tokens,
            stop=[stop] if isinstance(stop, str) else list(stop or []),
            seed=integer_parameter(known.get("seed")),
            temperature=known.get("temperature"),
            top_p=known.get("top_p"),
            frequency_penalty=known.get("frequency_penalty"),
            presence_penalty=known.get("presence_penalty"),
            logit_bias=known.get("logit_bias"),
            logprobs=bool(known.get("logprobs")),
            top_logprobs=integer_parameter(known.get("top_logprobs")) or 0,
            response_format=known.get("response_format"),
            tools=tools,
            tool_choice=tool_choice,
            user=known.get("user"),
            options=options,
            extra=extra,
            legacy_functions=legacy,
        )

    def screen_unsupported(self, body: Mapping[str, Any]) -> Mapping[str, Any]:
        """Refuse parameters the document marks rejected (400, as the documents say: the dialect
        itself refuses them, whatever the model); drop those it marks ignored."""
        unsupported = self.facts.unsupported
        if not unsupported:
            return body
        present = [name for name in body if name in unsupported and body[name] is not None]
        for name in present:
            if unsupported[name] == "rejected":
                raise unsupported_parameter(name, body[name])
        ignored = {name for name in present if unsupported[name] == "ignored"}
        return {k: v for k, v in body.items() if k not in ignored} if ignored else body

    def check(self, request: ChatRequest) -> None:
        """The dialect's rules its schema cannot express; raise a GatewayError to refuse."""

    # ----- rendering -------------------------------------------------------------------------

    @staticmethod
    def token_bytes(token: str) -> list[int] | None:
        return list(token.encode())

    def entry_bytes(self, token: str, given: TokenBytes) -> list[int] | None:
        """A logprob entry's `bytes`: as the backend gave them, else from the token's text."""
        if isinstance(given, FromToken) or (given is None and not self.null_bytes):
            return self.token_bytes(token)
        return given

    def entries(self, logprobs: list[TokenLogprob]) -> list[dict[str, Any]]:
        return [
            {
                "token": lp.token,
                "logprob": self.missing_logprob if lp.logprob is None else lp.logprob,
                "bytes": self.entry_bytes(lp.token, lp.bytes),
                "top_logprobs": [self.top_logprob_body(t) for t in lp.top],
            }
            for lp in logprobs
        ]

    def logprobs_body(
        self, logprobs: list[TokenLogprob] | None, refusal: list[TokenLogprob] | None = None
    ) -> Shared:
        if not self.logprobs_refusal:
            logprobs = logprobs if refusal is None else [*(logprobs or ()), *refusal]
            return None if logprobs is None else {"content": self.entries(logprobs)}
        if logprobs is None and refusal is None:
            return None
        return {
            "content": None if logprobs is None else self.entries(logprobs),
            "refusal": None if refusal is None else self.entries(refusal),
        }

    def top_logprob_body(self, top: TopLogprob) -> openai_doc.ChatCompletionTopLogprob:
        return {"token": top.token, "logprob": top.logprob, "bytes": self.entry_bytes(top.token, top.bytes)}

    @staticmethod
    def tool_call_body(call: ToolCallDelta) -> openai_doc.ChatCompletionMessageToolCall:
        return {
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": call.arguments},
        }

    @staticmethod
    def tool_call_chunk_body(call: ToolCallDelta) -> openai_doc.ChatCompletionMessageToolCallChunk:
        return {
            "index": call.call_index,
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": call.arguments},
        }

    def usage_body(self, usage: Usage) -> Shared:
        body: openai_doc.CompletionUsage = {
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.total_tokens,
        }
        if self.usage_details:
            if usage.completion_tokens_details is not None:
                body["completion_tokens_details"] = usage_detail_counts(usage.completion_tokens_details)  # type: ignore[typeddict-item]
            if usage.prompt_tokens_details is not None:
                body["prompt_tokens_details"] = usage_detail_counts(usage.prompt_tokens_details)  # type: ignore[typeddict-item]
        return body

    def finish_word(self, reason: FinishReason | None, request: ChatRequest) -> Shared:
        """The dialect's word (from `finish_reasons`, its document's enum)."""
        if reason == "tool_calls" and request.legacy_functions:
            return "function_call"  # only a document with `functions` lets a request say so
        return self.finish_reasons[reason or "stop"]

    def message_body(self, choice: Choice, request: ChatRequest) -> Shared:
        content: str | None = choice.text
        refusal = choice.refusal
        if refusal is not None and not self.refusal_field:
            content, refusal = content or refusal, None  # no field for it: the model's words
        message: dict[str, Any] = {"role": "assistant", "content": content}
        calls = choice.tool_calls
        if calls or refusal is not None:
            message["content"] = content or None
        if calls and request.legacy_functions:
            message["function_call"] = {"name": calls[0].name, "arguments": calls[0].arguments}
        elif calls:
            message["tool_calls"] = [self.tool_call_body(c) for c in calls]
        if self.refusal_field:
            message["refusal"] = refusal
        return message

    def completion(self, answer: Answer, completion: Completion) -> CompletionT:
        """The completion's body, in the dialect's document's type."""
        raise NotImplementedError

    def chunk_body(
        self,
        answer: Answer,
        state: StreamState[ChunkT],
        choices: list[StreamChoiceT],
        usage: Usage | None = None,
        last_of_choice: bool = False,
    ) -> ChunkT:
        """A chunk's body (`last_of_choice`: the chunk with the choice's finish reason)."""
        raise NotImplementedError

    def chunk_choice(
        self, index: int, delta: Shared, logprobs: Shared = None, finish_reason: Shared = None
    ) -> StreamChoiceT:
        """One choice of a chunk."""
        raise NotImplementedError

    def opened(
        self, answer: Answer, state: StreamState[ChunkT], index: int, delta: dict[str, Any]
    ) -> list[ChunkT]:
        """The chunks a choice's first piece takes: a role chunk first where the dialect has one,
        else the role in the piece's own delta (returned for the caller to add its chunk)."""
        if index in state.started:
            return []
        state.started.add(index)
        if not self.separate_role_chunk:
            delta["role"] = "assistant"
            return []
        opening = {"role": "assistant", "content": ""}
        return [self.chunk_body(answer, state, [self.chunk_choice(index, opening)])]

    def text_frame(self, answer: Answer, event: TextDelta, state: StreamState[ChunkT]) -> bytes | None:
        """A text piece of a choice already begun, framed as `chunks` and the framing frame it,
        from the choice's template (gateway/dialects/text_pieces.py); None where none applies
        (logprobs, the choice's first piece, a dialect that holds its chunks back). A new
        `served` (the backend said its fingerprint or tier) makes the template again."""
        if not self.text_templated or event.logprobs is not None or event.index not in state.started:
            return None
        template = state.texts.get(event.index)
        if template is None or template[1] is not state.served:
            frame = self.framing.frame
            marked = self.chunks(answer, TextDelta(event.index, TEXT_MARK), state)  # changes nothing
            template = state.texts[event.index] = (cut(b"".join(map(frame, marked)), TEXT_MARK), state.served)
        if (parts := template[0]) is None:
            return None
        return b"".join((parts[0], orjson.dumps(event.text), parts[1]))

    def chunks(self, answer: Answer, event: Event, state: StreamState[ChunkT]) -> list[ChunkT]:
        """The stream chunks one canonical event becomes (often one, sometimes none)."""
        request = answer.request
        match event:
            case (
                TextDelta(index=i, text=text, logprobs=logprobs)
                | RefusalDelta(index=i, text=text, logprobs=logprobs)
            ):
                refusal = isinstance(event, RefusalDelta) and self.refusal_field
                delta: dict[str, Any] = {"refusal" if refusal else "content": text}
                # a choice's later pieces, most of a stream, without asking `opened`
                out = [] if i in state.started else self.opened(answer, state, i, delta)
                if logprobs is None:  # most streams ask for none: no body to make
                    rendered = None
                else:
                    rendered = self.logprobs_body(None, logprobs) if refusal else self.logprobs_body(logprobs)
                out.append(self.chunk_body(answer, state, [self.chunk_choice(i, delta, rendered)]))
                return out
            case ToolCallDelta(index=i):
                if request.legacy_functions:
                    delta = {"function_call": {"name": event.name, "arguments": event.arguments}}
                else:
                    delta = {"tool_calls": [self.tool_call_chunk_body(event)]}
                if i not in state.started:
                    state.started.add(i)
                    delta = {"role": "assistant", "content": None, **delta}
                return [self.chunk_body(answer, state, [self.chunk_choice(i, delta)])]
            case Finish(index=i, reason=reason):
                delta = dict(self.finish_delta)
                if i not in state.started:
                    delta = {"role": "assistant", "content": "", **delta}
                state.started.add(i)
                choice = self.chunk_choice(i, delta, finish_reason=self.finish_word(reason, request))
                return [self.chunk_body(answer, state, [choice], last_of_choice=True)]
            case Usage():
                asked = self.usage_chunk == "asked" and request.include_usage
                if asked or self.usage_chunk == "always":
                    return [self.chunk_body(answer, state, [], usage=event)]
            case ServedBy():
                state.served = ServedBy(
                    event.system_fingerprint or state.served.system_fingerprint,
                    event.service_tier or state.served.service_tier,
                )
        return []

    # ----- errors ----------------------------------------------------------------------------

    def error_body(self, error: GatewayError, request_id: str) -> ErrorT:
        """The dialect's error body."""
        raise NotImplementedError

    def error(self, error: GatewayError, request_id: str) -> RenderedError:
        """A gateway error as this dialect answers it: status, body and headers."""
        error = self.named_unsupported(error)
        return RenderedError(error.status, self.error_body(error, request_id), dict(error.headers))

    def stream_error(
        self, error: GatewayError, request_id: str, state: StreamState[ChunkT]
    ) -> Mapping[str, Any]:
        """An error mid-stream: the body its HTTP error would have (the framing makes it an event)."""
        return self.error(error, request_id).body

    def named_unsupported(self, error: GatewayError) -> GatewayError:
        """A schema error about a parameter the document marks rejected, said as what it is: the
        parameter is not supported (its schema admits only null, so the schema's words would be
        "… is not of types null, string")."""
        loc = error.loc if isinstance(error, BadRequest) else None
        if not loc or len(loc) < 2 or loc[0] != "body":
            return error
        name = loc[1]
        if not isinstance(name, str) or self.facts.unsupported.get(name) != "rejected":
            return error
        return unsupported_parameter(name, error.value if len(loc) == 2 else None)
