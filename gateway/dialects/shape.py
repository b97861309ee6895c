"""The translator every OpenAI-shaped dialect is made from: a chat body read by its document's
fields into the one canonical request, and canonical events rendered as completions, chunks and
error bodies. A dialect's translator says, as data or a small override, what its document says
differently. Everything here is pure: no I/O, no policy, no server.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import orjson

from gateway.core.canonical import (
    ChatRequest,
    Choice,
    Completion,
    Event,
    Finish,
    FinishReason,
    TextDelta,
    TokenLogprob,
    ToolCallDelta,
    Usage,
)
from gateway.core.errors import BadRequest, GatewayError
from gateway.core.parameters import BY_SPELLING
from gateway.dialects.rules import Rule, first_breach
from gateway.framing import SSE, Framing

if TYPE_CHECKING:  # the documents' shapes, for the type checker only (generated/, no run-time cost)
    from generated import openai as openai_doc

JSON = "application/json"
# The names of the token limit, the first one given winning (OpenAI's newer name over its older
# one; Aleph Alpha's client's name last).
TOKEN_LIMITS = ("max_completion_tokens", "max_tokens", "maximum_tokens")


@dataclass(frozen=True, slots=True)
class DocumentFacts:
    """What a translator takes from its dialect's document, once, at start."""

    fields: frozenset[str]  # the parameters a chat body may hold
    unsupported: Mapping[str, str] = field(default_factory=dict)  # name → "ignored" | "rejected"
    rules: tuple[Rule, ...] = ()  # the document's `x-chatgate-rules` (gateway/dialects/rules.py)


@dataclass(slots=True)
class Answer:
    """What every body of one answer shares."""

    id: str
    created: int
    model: str
    request: ChatRequest


@dataclass(slots=True)
class StreamState:
    """What a stream's translation remembers between events."""

    started: set[int] = field(default_factory=set)  # choices whose first chunk went out


@dataclass(slots=True)
class RenderedError:
    status: int
    body: Mapping[str, Any]
    headers: dict[str, str]

    def json(self) -> bytes:
        return orjson.dumps(self.body)


class OpenAIShaped:
    """OpenAI's chat completion shapes, with the knobs the other dialects turn."""

    framing: ClassVar[Framing] = SSE
    id_prefix: ClassVar[str] = "chatcmpl-"
    # canonical finish reason → the dialect's word
    finish_reasons: ClassVar[Mapping[FinishReason, str]] = {
        "stop": "stop",
        "stop_sequence": "stop",
        "length": "length",
        "tool_calls": "tool_calls",
        "content_filter": "content_filter",
    }
    # what a token's logprob reads when the backend gave none (Aleph Alpha documents -9999.0)
    missing_logprob: ClassVar[float | None] = None
    # whether each choice's stream opens with a chunk that carries only the role (OpenAI does)
    separate_role_chunk: ClassVar[bool] = True
    # the delta of the chunk that carries a finish reason (some dialects require `content`)
    finish_delta: ClassVar[Mapping[str, Any]] = {}
    model_in_bodies: ClassVar[bool] = True  # `model` in completions and chunks
    refusal_in_message: ClassVar[bool] = False  # `message.refusal: null`
    refusal_in_logprobs: ClassVar[bool] = True  # `logprobs.refusal: null`
    logprobs_listed_in_chunks: ClassVar[bool] = False  # a chunk's logprobs as a one-element list

    def __init__(self, facts: DocumentFacts) -> None:
        self.facts = facts

    # ----- reading ---------------------------------------------------------------------------

    def read(self, body: dict[str, Any]) -> ChatRequest:
        """A validated chat body → the canonical request. Only the parameters the document
        defines are read; the others go to `extra`, untouched, for the extra-parameters policy."""
        body = self.screen_unsupported(body)
        if (breach := first_breach(self.facts.rules, body)) is not None:
            raise breach
        defined = self.facts.fields
        known: dict[str, Any] = {}
        options: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for name, value in body.items():
            if name not in defined:
                extra[name] = value
                continue
            parameter = BY_SPELLING.get(name)
            if parameter is not None and parameter.field:
                known[name] = value
            elif value is not None:  # an option sent as null is not set
                options[name if parameter is None else parameter.name] = value
        request = self.canonical(known, options, extra)
        self.check(request)
        return request

    @staticmethod
    def canonical(known: dict[str, Any], options: dict[str, Any], extra: dict[str, Any]) -> ChatRequest:
        stop = known.get("stop")
        tools = list(known.get("tools") or [])
        tool_choice = known.get("tool_choice")
        if known.get("functions"):  # legacy functions → tools
            tools += [{"type": "function", "function": f} for f in known["functions"]]
            legacy_choice = known.get("function_call")
            if isinstance(legacy_choice, dict):
                tool_choice = {"type": "function", "function": legacy_choice}
            elif legacy_choice is not None:
                tool_choice = legacy_choice
        max_tokens = next((known[name] for name in TOKEN_LIMITS if known.get(name) is not None), None)
        return ChatRequest(
            model=known.get("model"),
            messages=known["messages"],
            stream=bool(known.get("stream")),
            include_usage=bool((known.get("stream_options") or {}).get("include_usage")),
            n=known.get("n") or 1,
            max_tokens=max_tokens,
            stop=[stop] if isinstance(stop, str) else list(stop or []),
            seed=known.get("seed"),
            temperature=known.get("temperature"),
            top_p=known.get("top_p"),
            frequency_penalty=known.get("frequency_penalty"),
            presence_penalty=known.get("presence_penalty"),
            logit_bias=known.get("logit_bias"),
            logprobs=bool(known.get("logprobs")),
            top_logprobs=known.get("top_logprobs") or 0,
            response_format=known.get("response_format"),
            tools=tools,
            tool_choice=tool_choice,
            user=known.get("user"),
            options=options,
            extra=extra,
        )

    def screen_unsupported(self, body: dict[str, Any]) -> dict[str, Any]:
        """Refuse parameters the document marks rejected (400, as the documents say: the dialect
        itself refuses them, whatever the model); drop those it marks ignored."""
        unsupported = self.facts.unsupported
        if not unsupported:
            return body
        present = [name for name in body if name in unsupported and body[name] is not None]
        for name in present:
            if unsupported[name] == "rejected":
                raise BadRequest(
                    f"The parameter '{name}' is not supported by this API.",
                    param=name,
                    loc=["body", name],
                    value=body[name],
                    code="UnsupportedParameter",
                )
        ignored = {name for name in present if unsupported[name] == "ignored"}
        return {k: v for k, v in body.items() if k not in ignored} if ignored else body

    def check(self, request: ChatRequest) -> None:
        """The dialect's rules its schema cannot express; raise a GatewayError to refuse."""

    # ----- rendering -------------------------------------------------------------------------

    @staticmethod
    def token_bytes(token: str) -> list[int] | None:
        return list(token.encode())

    def logprobs_body(self, logprobs: list[TokenLogprob] | None) -> dict[str, Any] | None:
        if logprobs is None:
            return None
        body: dict[str, Any] = {
            "content": [
                {
                    "token": lp.token,
                    "logprob": self.missing_logprob if lp.logprob is None else lp.logprob,
                    "bytes": self.token_bytes(lp.token),
                    "top_logprobs": [self.top_logprob_body(t.token, t.logprob) for t in lp.top],
                }
                for lp in logprobs
            ]
        }
        if self.refusal_in_logprobs:
            body["refusal"] = None
        return body

    def top_logprob_body(self, token: str, logprob: float) -> openai_doc.ChatCompletionTopLogprob:
        return {"token": token, "logprob": logprob, "bytes": self.token_bytes(token)}

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

    @staticmethod
    def usage_body(usage: Usage) -> openai_doc.CompletionUsage:
        return {
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.total_tokens,
        }

    def message_body(self, choice: Choice) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": choice.text}
        if choice.tool_calls:
            message["content"] = choice.text or None
            message["tool_calls"] = [self.tool_call_body(c) for c in choice.tool_calls]
        if self.refusal_in_message:
            message["refusal"] = None
        return message

    def choice_body(self, choice: Choice) -> dict[str, Any]:
        return {
            "index": choice.index,
            "message": self.message_body(choice),
            "logprobs": self.logprobs_body(choice.logprobs),
            "finish_reason": self.finish_reasons[choice.finish_reason or "stop"],
        }

    def body(self, answer: Answer, kind: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        """A completion's or a chunk's body, without usage (one dict: this runs per chunk)."""
        if self.model_in_bodies:
            return {
                "id": answer.id,
                "object": kind,
                "created": answer.created,
                "model": answer.model,
                "choices": choices,
            }
        return {"id": answer.id, "object": kind, "created": answer.created, "choices": choices}

    def completion(self, answer: Answer, completion: Completion) -> dict[str, Any]:
        body = self.body(answer, "chat.completion", [self.choice_body(c) for c in completion.choices])
        body["usage"] = self.usage_body(completion.usage)
        return body

    def chunk_body(
        self, answer: Answer, choices: list[dict[str, Any]], usage: Usage | None = None
    ) -> dict[str, Any]:
        chunk = self.body(answer, "chat.completion.chunk", choices)
        if usage is not None:
            chunk["usage"] = self.usage_body(usage)
        return chunk

    def chunk_choice(
        self,
        index: int,
        delta: dict[str, Any],
        logprobs: list[TokenLogprob] | None = None,
        finish_reason: str | None = None,
    ) -> dict[str, Any]:
        rendered = self.logprobs_body(logprobs)
        return {
            "index": index,
            "delta": delta,
            "logprobs": [rendered] if rendered is not None and self.logprobs_listed_in_chunks else rendered,
            "finish_reason": finish_reason,
        }

    def chunks(self, answer: Answer, event: Event, state: StreamState) -> list[dict[str, Any]]:
        """The stream chunks one canonical event becomes (often one, sometimes none)."""
        started = state.started
        match event:
            case TextDelta(index=i, text=text, logprobs=logprobs):
                delta: dict[str, Any] = {"content": text}
                if i in started:
                    return [self.chunk_body(answer, [self.chunk_choice(i, delta, logprobs)])]
                started.add(i)
                if not self.separate_role_chunk:
                    delta = {"role": "assistant", **delta}
                    return [self.chunk_body(answer, [self.chunk_choice(i, delta, logprobs)])]
                return [
                    self.chunk_body(answer, [self.chunk_choice(i, {"role": "assistant", "content": ""})]),
                    self.chunk_body(answer, [self.chunk_choice(i, delta, logprobs)]),
                ]
            case ToolCallDelta(index=i):
                delta = {"tool_calls": [self.tool_call_chunk_body(event)]}
                if i not in started:
                    started.add(i)
                    delta = {"role": "assistant", "content": None, **delta}
                return [self.chunk_body(answer, [self.chunk_choice(i, delta)])]
            case Finish(index=i, reason=reason):
                delta = dict(self.finish_delta)
                if i not in started:
                    delta = {"role": "assistant", "content": "", **delta}
                started.add(i)
                choice = self.chunk_choice(i, delta, finish_reason=self.finish_reasons[reason])
                return [self.chunk_body(answer, [choice])]
            case Usage():
                if answer.request.include_usage:
                    return [self.chunk_body(answer, [], usage=event)]
        return []

    # ----- errors ----------------------------------------------------------------------------

    def error_body(self, error: GatewayError, request_id: str) -> Mapping[str, Any]:
        """OpenAI's error body; a dialect with its own shape overrides this."""
        body: openai_doc.ErrorResponse = {
            "error": {
                "message": error.message,
                "type": error.kind,
                "param": error.param,
                "code": error.code,
            }
        }
        return body

    def error(self, error: GatewayError, request_id: str) -> RenderedError:
        """A gateway error as this dialect answers it: status, body and headers."""
        return RenderedError(error.status, self.error_body(error, request_id), dict(error.headers))
