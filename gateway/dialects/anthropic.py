"""Anthropic's Messages API: POST /v1/messages (a `Message`, or named-event SSE),
POST /v1/messages/count_tokens, GET /v1/models and /v1/models/{model_id}. Not OpenAI-shaped: the
translator implements the protocol (gateway/dialects/translator.py) directly. The request's
system prompt, content blocks, tools and tool choice become the canonical (OpenAI-shaped)
messages and tools (gateway/dialects/anthropic_read.py); events become content blocks, each
stream block opened, filled and always closed; errors are Anthropic's `{"type": "error", …}`
with its error types and statuses (the gateway's 503 said as 529 `overloaded_error`)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal, Protocol, cast

import orjson
from starlette.responses import Response

from gateway.core.canonical import (
    ChatRequest,
    Completion,
    Event,
    Finish,
    FinishReason,
    NativeBody,
    RefusalDelta,
    TextDelta,
    ToolCallDelta,
    Usage,
)
from gateway.core.errors import (
    BadRequest,
    ContentFiltered,
    GatewayError,
    ModelNotFound,
    NotFound,
)
from gateway.core.token_count import estimate
from gateway.dialects.anthropic_read import read_messages, tool_text
from gateway.dialects.defaults import defaulted
from gateway.dialects.dialect import Dialect, Handler, ModelDirectory, OperationCall
from gateway.dialects.framing import NamedEventSSE
from gateway.dialects.text_pieces import TEXT_MARK, cut
from gateway.dialects.translator import JSON, Answer, DocumentFacts, RenderedError, Translator

if TYPE_CHECKING:
    from generated import anthropic as anthropic_doc

# canonical finish reason → Anthropic's stop reason
STOP_REASONS: dict[FinishReason, anthropic_doc.StopReason] = {
    "stop": "end_turn",
    "stop_sequence": "stop_sequence",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "content_filter": "refusal",
}
# the gateway's error kinds (OpenAI's words) → Anthropic's error types, by status first
ERROR_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}
# the body's fields read as canonical parameters → their canonical names (for the document's
# declared defaults, gateway/dialects/defaults.py)
PARAMETERS = {
    "max_tokens": "max_tokens",
    "stop_sequences": "stop",
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "tools": "tools",
    "tool_choice": "tool_choice",
}
OVERLOADED = 529  # Anthropic's status for "try again soon" (the gateway's 503)
SAFE_ID = re.compile(r"[^A-Za-z0-9_-]")
REQUIRED = re.compile(r'"([^"]+)" is a required property')


# a message that begins with the field it is about (the media screen's): said as it is
NAMES_ITS_FIELD = re.compile(r"^[\w.\[\]]+: ")


class AnthropicSSE(NamedEventSSE):
    """Named events, kept alive with Anthropic's own `ping` event (the SDKs skip it)."""

    keepalive: bytes | None = b'event: ping\ndata: {"type":"ping"}\n\n'


def tool_use_id(backend_id: str) -> str:
    """A backend's tool call id as Anthropic's `toolu_…` (kept when it is one already); the
    client sends it back in its `tool_result`, and the upstream sees the same id both times."""
    if backend_id.startswith("toolu_"):
        return SAFE_ID.sub("_", backend_id)
    return "toolu_" + SAFE_ID.sub("_", backend_id)


def tool_input(arguments: str) -> dict[str, Any]:
    """A tool call's arguments as the object `input` is (a backend's broken JSON kept whole)."""
    try:
        value = orjson.loads(arguments) if arguments else {}
    except orjson.JSONDecodeError:
        return {"_arguments": arguments}
    return value if isinstance(value, dict) else {"_arguments": value}


def usage_body(usage: Usage) -> anthropic_doc.Usage:
    cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else None
    return {
        "input_tokens": usage.prompt_tokens,
        "output_tokens": usage.completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached or 0,
        "cache_creation": None,
        "inference_geo": None,
        "output_tokens_details": None,
        "server_tool_use": None,
        "service_tier": "standard",  # the one tier there is (a generated client reads no null enum)
    }


def text_block(text: str) -> anthropic_doc.TextBlock:
    return {"type": "text", "text": text, "citations": None}


def tool_use_block(call: ToolCallDelta, with_input: bool = True) -> anthropic_doc.ToolUseBlock:
    return {
        "type": "tool_use",
        "id": tool_use_id(call.id),
        "name": call.name,
        "input": tool_input(call.arguments) if with_input else {},
        "caller": {"type": "direct"},
    }


@dataclass(slots=True)
class MessageStream:
    """What one stream remembers: whether `message_start` went out, the open block (its index
    and kind), the next block's index and how the message ended."""

    started: bool = False
    open: Literal["text", "tool_use"] | None = None
    index: int = 0  # the open block's index, else the next one's
    stop_reason: anthropic_doc.StopReason = None
    stop_sequence: str | None = None
    called: bool = False  # whether a tool_use block went out
    native: bool = False  # the upstream's own frames are written (a native pass-through)
    stopped: bool = False  # a policy step ended it (the content filter): nothing more is written
    # the open text block's delta framed, cut around its text, and the block's index
    # (AnthropicTranslator.text_frame)
    template: tuple[int, tuple[bytes, ...] | None] | None = None


def stop_reason(finish: FinishReason, called: bool) -> anthropic_doc.StopReason:
    """Anthropic's stop reason: a message that ends by itself after calling a tool ends with
    tool_use (OpenAI-compatible servers say `stop` for a call a named tool_choice forced)."""
    reason = STOP_REASONS[finish]
    return "tool_use" if called and reason == "end_turn" else reason


class AnthropicTranslator:
    framing = AnthropicSSE()
    id_prefix = "msg_"
    finish_reasons = STOP_REASONS  # the canonical finish reason's word

    def __init__(self, facts: DocumentFacts) -> None:
        self.facts = facts

    # ----- reading ---------------------------------------------------------------------------

    def read(self, body: anthropic_doc.CreateMessageParams) -> ChatRequest:
        """The body → the canonical request: the system prompt and messages as OpenAI-shaped
        messages, tools as functions; fields with no meaning here dropped and named."""
        dropped: set[str] = set()
        unsupported = self.facts.unsupported
        extra: dict[str, Any] = {}
        for name, value in body.items():
            if name in unsupported:
                if value is not None:
                    dropped.add(name)
            elif name not in self.facts.fields:
                extra[name] = value
        messages, tools, tool_choice = read_messages(body, dropped)
        options: dict[str, Any] = {}
        if body.get("top_k") is not None:
            options["top_k"] = body["top_k"]
        choice = body.get("tool_choice")
        if choice is not None and choice.get("disable_parallel_tool_use"):
            options["parallel_tool_calls"] = False
        metadata = body.get("metadata") or {}
        return ChatRequest(
            model=body.get("model"),
            messages=messages,
            stream=bool(body.get("stream")),
            max_tokens=body.get("max_tokens"),
            stop=list(body.get("stop_sequences") or ()),
            temperature=body.get("temperature"),
            top_p=body.get("top_p"),
            tools=tools,
            tool_choice=tool_choice,
            user=metadata.get("user_id"),
            options=options,
            extra=extra,
            defaulted=defaulted(self.facts.defaults, body, PARAMETERS),
            dropped=sorted(dropped),
            native=NativeBody("messages", body, frozenset(extra)),  # type: ignore[arg-type]
        )

    # ----- a whole answer --------------------------------------------------------------------

    def completion(self, answer: Answer, completion: Completion) -> anthropic_doc.Message:
        native = completion.usage.frames
        if native and not filtered(completion):  # the upstream's own message, as the client's
            return cast("anthropic_doc.Message", {**native[0], "id": answer.id, "model": answer.model})
        choice = completion.choices[0] if completion.choices else None
        content: list[anthropic_doc.ContentBlock] = []
        reason: anthropic_doc.StopReason = "end_turn"
        stop_sequence = None
        if choice is not None:
            text = choice.text or choice.refusal or ""
            if text:
                content.append(text_block(text))
            content += [tool_use_block(call) for call in choice.tool_calls]
            reason = stop_reason(choice.finish_reason or "stop", bool(choice.tool_calls))
            if reason == "stop_sequence":
                stop_sequence = choice.stop_sequence
        return {
            "id": answer.id,
            "type": "message",
            "role": "assistant",
            "content": content,
            "model": answer.model,
            "stop_reason": reason,
            "stop_sequence": stop_sequence,
            "stop_details": None,
            "container": None,
            "usage": usage_body(completion.usage),
        }

    # ----- a stream --------------------------------------------------------------------------

    def new_stream_state(self) -> MessageStream:
        return MessageStream()

    def message_start(self, answer: Answer) -> anthropic_doc.MessageStartEvent:
        return {
            "type": "message_start",
            "message": {
                "id": answer.id,
                "type": "message",
                "role": "assistant",
                "content": [],
                "model": answer.model,
                "stop_reason": None,
                "stop_sequence": None,
                "stop_details": None,
                "container": None,
                "usage": usage_body(Usage(answer.request.prompt_tokens, 0)),
            },
        }

    @staticmethod
    def closed(state: MessageStream) -> list[Any]:
        """The open block's `content_block_stop` (every block gets one), if a block is open."""
        if state.open is None:
            return []
        stop: anthropic_doc.ContentBlockStopEvent = {"type": "content_block_stop", "index": state.index}
        state.open = None
        state.index += 1
        return [stop]

    def chunks(self, answer: Answer, event: Event, state: MessageStream) -> list[Any]:
        if state.native or event.frames is not None:
            return self.native_chunks(answer, event, state)
        out: list[Any] = []
        if not state.started:
            state.started = True
            out.append(self.message_start(answer))
        match event:
            case TextDelta(index=0, text=text) | RefusalDelta(index=0, text=text) if text:
                if state.open != "text":
                    out += self.closed(state)
                    state.open = "text"
                    start: anthropic_doc.ContentBlockStartEvent = {
                        "type": "content_block_start",
                        "index": state.index,
                        "content_block": text_block(""),
                    }
                    out.append(start)
                delta: anthropic_doc.ContentBlockDeltaEvent = {
                    "type": "content_block_delta",
                    "index": state.index,
                    "delta": {"type": "text_delta", "text": text},
                }
                out.append(delta)
            case ToolCallDelta(index=0):
                out += self.closed(state)
                index = state.index
                out.append(
                    {
                        "type": "content_block_start",
                        "index": index,
                        "content_block": tool_use_block(event, False),
                    }
                )
                if event.arguments:
                    out.append(
                        {
                            "type": "content_block_delta",
                            "index": index,
                            "delta": {"type": "input_json_delta", "partial_json": event.arguments},
                        }
                    )
                state.open = "tool_use"  # a backend sends each call whole: closed at once
                state.called = True
                out += self.closed(state)
            case Finish(index=0, reason=reason):
                out += self.closed(state)
                state.stop_reason = stop_reason(reason, state.called)
                state.stop_sequence = event.stop if reason == "stop_sequence" else None
            case Usage():
                out += self.closed(state)
                message_delta: anthropic_doc.MessageDeltaEvent = {
                    "type": "message_delta",
                    "delta": {
                        "stop_reason": state.stop_reason or "end_turn",
                        "stop_sequence": state.stop_sequence,
                        "stop_details": None,
                        "container": None,
                    },
                    "usage": {
                        "input_tokens": event.prompt_tokens,
                        "output_tokens": event.completion_tokens,
                        "cache_creation_input_tokens": 0,
                        "cache_read_input_tokens": usage_body(event)["cache_read_input_tokens"],
                        "output_tokens_details": None,
                        "server_tool_use": None,
                    },
                }
                out.append(message_delta)
                out.append({"type": "message_stop"})
        return out

    def text_frame(self, answer: Answer, event: TextDelta, state: MessageStream) -> bytes | None:
        """A text piece of the open text block, framed as `chunks` and the framing frame it, from
        the block's template (gateway/dialects/text_pieces.py); None where none applies (the
        block's first piece, an empty one, a native pass-through)."""
        if state.open != "text" or not event.text or event.index or state.native or event.frames is not None:
            return None
        template = state.template
        if template is None or template[0] != state.index:
            marked = self.chunks(answer, TextDelta(0, TEXT_MARK), state)  # in the open block: changes nothing
            framed = b"".join(map(self.framing.frame, marked))
            template = state.template = (state.index, cut(framed, TEXT_MARK))
        if (parts := template[1]) is None:
            return None
        return b"".join((parts[0], orjson.dumps(event.text), parts[1]))

    def native_chunks(self, answer: Answer, event: Event, state: MessageStream) -> list[Any]:
        """An upstream's own frames as they came, the message's id and model the client's; an
        event a policy step made instead (the content filter's finish) ends the stream with an
        error event."""
        state.native = True
        if state.stopped:
            return []
        frames = event.frames
        if frames is None:
            if isinstance(event, Finish) and event.reason == "content_filter":
                state.stopped = True
                return [self.error_body(FILTERED, "")]
            return []
        return [
            {**frame, "message": {**frame["message"], "id": answer.id, "model": answer.model}}
            if frame.get("type") == "message_start"
            else frame
            for frame in frames
        ]

    # ----- errors ----------------------------------------------------------------------------

    @staticmethod
    def said(error: GatewayError) -> GatewayError:
        """The gateway's error in Anthropic's words: an unknown model is `model: <name>` not found
        (a key's hidden deployment is a 403 `permission_error`); a schema error begins with
        where, dotted (`messages.0.role: …`)."""
        if isinstance(error, ModelNotFound):
            return NotFound(f"model: {error.model}", param="model")
        loc = error.loc if isinstance(error, BadRequest) else None
        if loc and loc[0] == "body" and not NAMES_ITS_FIELD.match(error.message):
            message = error.message.removeprefix("Invalid request body: ")
            message = re.sub(r" at '[^']*'$", "", message)
            missing = REQUIRED.fullmatch(message)
            if missing is not None:  # as Anthropic says it: `max_tokens: Field required`
                loc, message = [*loc, missing[1]], "Field required"
            elif len(loc) == 1:
                return error
            where = ".".join(map(str, loc[1:]))
            said = BadRequest(f"{where}: {message}", param=error.param, loc=loc, value=error.value)
            said.status, said.code, said.headers = error.status, error.code, error.headers
            return said
        return error

    def error_body(self, error: GatewayError, request_id: str) -> anthropic_doc.ErrorResponse:
        kind = ERROR_TYPES.get(error.status) or (
            "invalid_request_error" if error.status < 500 else "api_error"
        )
        return {
            "type": "error",
            "error": {"type": kind, "message": error.message},  # type: ignore[typeddict-item]
            "request_id": request_id or None,
        }

    def error(self, error: GatewayError, request_id: str) -> RenderedError:
        error = self.said(error)
        status = OVERLOADED if error.status == 503 else error.status
        headers = dict(error.headers)
        if request_id:
            headers["request-id"] = request_id
        # a 429 without one is one that waiting would not help (a prompt larger than the limit)
        if status == OVERLOADED and not any(k.lower() == "retry-after" for k in headers):
            headers["retry-after"] = "1"
        body = self.error_body(error, request_id)
        if status == OVERLOADED:
            body["error"]["type"] = "overloaded_error"
        return RenderedError(status, body, headers)

    def stream_error(self, error: GatewayError, request_id: str, state: MessageStream) -> Any:
        return self.error(error, request_id).body


FILTERED = ContentFiltered("The answer was stopped by the content filter.", code="content_filter")


def filtered(completion: Completion) -> bool:
    """Whether a policy step ended a choice (the content filter): the answer is then the
    gateway's own rendering, not the upstream's."""
    return any(choice.finish_reason == "content_filter" for choice in completion.choices)


# ----- the other operations ------------------------------------------------------------------


class BodyCall(OperationCall, Protocol):
    """An operation's call with its validated body and request id (gateway.http.call.Call)."""

    @property
    def body(self) -> Any: ...
    @property
    def request_id(self) -> str: ...


def model_info(name: str, started: int) -> anthropic_doc.ModelInfo:
    created = datetime.fromtimestamp(started, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "type": "model",
        "id": name,
        "display_name": name,
        "created_at": created,
        "capabilities": None,
        "max_input_tokens": None,
        "max_tokens": None,
    }


def json_response(body: Any, request_id: str) -> Response:
    return Response(orjson.dumps(body), media_type=JSON, headers={"request-id": request_id})


def operations(runtime: ModelDirectory, translator: Translator[Any]) -> dict[str, Handler]:
    def routed(model: str, call: OperationCall) -> str:
        """The deployment the model names, if the caller's key may use it (else not found)."""
        try:
            deployment = runtime.router.route(model)
        except ModelNotFound:
            raise NotFound(f"model: {model}", param="model") from None
        if not call.caller.may_use(deployment.name):
            raise NotFound(f"model: {model}", param="model")
        return deployment.name

    async def count_message_tokens(operation_call: OperationCall) -> Response:
        """Counted, never charged: no limit or budget sees it (Claude Code sends dozens at once)."""
        call = cast(BodyCall, operation_call)
        body: anthropic_doc.CountMessageTokensParams = call.body
        deployment = routed(body["model"], call)
        messages, tools, _choice = read_messages(body, set())
        if tools:  # the tools' names, descriptions and schemas are prompt too
            messages = [*messages, {"role": "system", "content": tool_text(tools)}]
        # the runtime's policy holds each deployment's prompt counter (its tokenizer, else the
        # estimate admission uses); a directory without one estimates
        policy = getattr(getattr(runtime, "pipeline", None), "policy", None)
        counter = getattr(policy, "counters", {}).get(deployment)
        tokens = await counter.count(messages) if counter is not None else estimate(messages)
        counted: anthropic_doc.CountMessageTokensResponse = {"input_tokens": tokens}
        return json_response(counted, call.request_id)

    async def list_models(operation_call: OperationCall) -> Response:
        call = cast(BodyCall, operation_call)
        names = runtime.router.model_names(call.caller.may_use)
        listed: anthropic_doc.ListModelsResponse = {
            "data": [model_info(name, runtime.started) for name in names],
            "first_id": names[0] if names else None,
            "last_id": names[-1] if names else None,
            "has_more": False,
        }
        return json_response(listed, call.request_id)

    async def get_model(operation_call: OperationCall) -> Response:
        call = cast(BodyCall, operation_call)
        model = call.path_params["model_id"]
        routed(model, call)
        return json_response(model_info(model, runtime.started), call.request_id)

    return {"countMessageTokens": count_message_tokens, "listModels": list_models, "getModel": get_model}


DIALECT = Dialect(
    name="anthropic",
    document="anthropic.yaml",
    translator=AnthropicTranslator,
    chat_operations=("createMessage",),
    operations=operations,
    screens_media=True,
    probes="anthropic",
)
