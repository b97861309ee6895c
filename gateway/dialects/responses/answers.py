"""The Responses API's translator (`gateway.dialects.translator.Translator`, implemented directly):
canonical events rendered as one `response` object, or as the named, numbered stream events of its
lifecycle — `response.created`, `response.in_progress`, each output item added, its parts and
deltas, the item done (whole: Codex reads the text only there), `response.completed` (or
`.incomplete`); an error after the 200 is an `error` event. Errors before it are OpenAI's."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from gateway.core.canonical import (
    ChatRequest,
    Completion,
    Event,
    Finish,
    FinishReason,
    RefusalDelta,
    ServedBy,
    TextDelta,
    TokenLogprob,
    ToolCallDelta,
    Usage,
)
from gateway.core.errors import GatewayError
from gateway.core.ids import random_hex
from gateway.dialects.framing import NamedEventSSE
from gateway.dialects.responses.reading import Echo, read
from gateway.dialects.text_pieces import NUMBER_MARK, TEXT_MARK, cut
from gateway.dialects.translator import Answer, DocumentFacts, RenderedError, TranslatorFactory

if TYPE_CHECKING:
    from generated import openai as openai_doc

# the echoed settings' values when the request left them out, as OpenAI's responses show them
DEFAULTS: dict[str, Any] = {
    "temperature": 1.0,
    "top_p": 1.0,
    "parallel_tool_calls": True,
    "tool_choice": "auto",
    "truncation": "disabled",
    "service_tier": "default",
    "top_logprobs": 0,
}
INCOMPLETE: dict[str | None, str] = {"length": "max_output_tokens", "content_filter": "content_filter"}


def item_id(prefix: str) -> str:
    return prefix + random_hex()


def logprob_entries(logprobs: list[TokenLogprob] | None) -> list[dict[str, Any]]:
    if not logprobs:
        return []
    return [
        {
            "token": lp.token,
            "logprob": -9999.0 if lp.logprob is None else lp.logprob,
            "bytes": list(lp.token.encode()),
            "top_logprobs": [
                {"token": t.token, "logprob": t.logprob, "bytes": list(t.token.encode())} for t in lp.top
            ],
        }
        for lp in logprobs
    ]


def usage_body(usage: Usage) -> openai_doc.ResponseUsage:
    prompt = usage.prompt_tokens_details
    completion = usage.completion_tokens_details
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {
            "cached_tokens": (prompt.cached_tokens if prompt else None) or 0,
            "cache_write_tokens": 0,
        },
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {
            "reasoning_tokens": (completion.reasoning_tokens if completion else None) or 0
        },
        "total_tokens": usage.total_tokens,
    }


def as_clients(answer: Answer, response: dict[str, Any]) -> dict[str, Any]:
    """An upstream's response as the client's: this answer's id and the model it asked for."""
    return {**response, "id": answer.id, "model": answer.model}


def echo_of(request: ChatRequest) -> Echo:
    echo = request.echo
    assert isinstance(echo, Echo), "a Responses request carries its echo"
    return echo


def response_body(
    answer: Answer,
    status: str,
    output: list[dict[str, Any]],
    usage: Usage | None = None,
    served: ServedBy | None = None,
    reason: FinishReason | None = None,
    error: dict[str, str] | None = None,
) -> openai_doc.Response:
    """The `response` object as it stands: the request's settings echoed, the output so far."""
    echo = echo_of(answer.request)
    body = echo.body
    text = body.get("text") or {}
    reasoning = body.get("reasoning") or {}
    incomplete = INCOMPLETE.get(reason) if status == "incomplete" and reason else None
    response: dict[str, Any] = {
        "id": answer.id,
        "object": "response",
        "created_at": answer.created,
        "status": status,
        "completed_at": int(time.time()) if status == "completed" else None,
        "error": error,
        "incomplete_details": {"reason": incomplete} if incomplete else None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "model": answer.model,
        "output": output,
        "parallel_tool_calls": default(body, "parallel_tool_calls"),
        "previous_response_id": echo.previous_response_id,
        # the effort as asked; no backend here writes a reasoning summary, so none is given
        "reasoning": {"effort": reasoning.get("effort"), "summary": None},
        "service_tier": (served.service_tier if served else None) or default(body, "service_tier"),
        "store": echo.store,
        "temperature": default(body, "temperature"),
        "text": {
            "format": text.get("format") or {"type": "text"},
            "verbosity": text.get("verbosity") or "medium",
        },
        "tool_choice": tool_choice_echo(body),
        "tools": [tool_echo(tool) for tool in body.get("tools") or () if tool.get("type") == "function"],
        "top_logprobs": default(body, "top_logprobs"),
        "top_p": default(body, "top_p"),
        "truncation": default(body, "truncation"),
        "metadata": body.get("metadata") or {},
        "safety_identifier": body.get("safety_identifier"),
        "prompt_cache_key": body.get("prompt_cache_key"),
    }
    if body.get("user") is not None:
        response["user"] = body["user"]
    if usage is not None:
        response["usage"] = usage_body(usage)
    return response  # type: ignore[return-value]


def default(body: Any, name: str) -> Any:
    value = body.get(name)
    return DEFAULTS[name] if value is None else value


def tool_choice_echo(body: Any) -> Any:
    """The tool choice as it was followed: a word, or a named function (one for a hosted tool,
    which was not offered, reads as `auto`; allowed tools as their mode)."""
    choice = body.get("tool_choice")
    if choice is None or isinstance(choice, str):
        return DEFAULTS["tool_choice"] if choice is None else choice
    if choice.get("type") == "function" and choice.get("name"):
        return {"type": "function", "name": choice["name"]}
    if choice.get("type") == "allowed_tools":
        return choice.get("mode", "auto")
    return "auto"


def tool_echo(tool: dict[str, Any]) -> dict[str, Any]:
    """A function tool as a response lists it: every field, null where not sent."""
    return {
        "type": "function",
        "name": tool["name"],
        "description": tool.get("description"),
        "parameters": tool.get("parameters"),
        "strict": tool.get("strict"),
    }


def message_item(
    message_id: str, status: str, text: str | None, refusal: str | None, logprobs: list[dict[str, Any]]
) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if text is not None:
        content.append({"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs})
    if refusal is not None:
        content.append({"type": "refusal", "refusal": refusal})
    return {"id": message_id, "type": "message", "status": status, "role": "assistant", "content": content}


def function_call_item(
    call: ToolCallDelta, status: str = "completed", arguments: str | None = None
) -> dict[str, Any]:
    return {
        "id": "fc_" + random_hex(),
        "type": "function_call",
        "status": status,
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments if arguments is None else arguments,
    }


def output_text(output: list[dict[str, Any]]) -> str:
    """The output's text, all messages' text parts joined (the SDKs' `output_text`)."""
    return "".join(
        part["text"]
        for item in output
        if item["type"] == "message"
        for part in item["content"]
        if part["type"] == "output_text"
    )


@dataclass(slots=True)
class ResponseStream:
    """What one stream's translation remembers: the next sequence number, the output so far
    (the item being written last), the open message's parts."""

    sequence: int = 0
    started: bool = False
    output: list[dict[str, Any]] = field(default_factory=list)
    message: dict[str, Any] | None = None  # the message item being written
    part: dict[str, Any] | None = None  # its content part being written
    pieces: list[str] = field(default_factory=list)  # that part's text so far
    at: dict[str, Any] = field(default_factory=dict)  # that part's item_id, output_index, content_index
    served: ServedBy = field(default_factory=ServedBy)
    reason: FinishReason | None = None
    response: dict[str, Any] | None = None  # the whole response, once it has ended
    native: bool = False  # the upstream's own events are written (a native pass-through)
    stopped: bool = False  # a policy step ended it (the content filter): nothing more is written
    # the open text part's delta event framed, cut around its text and its sequence number, and
    # the part's place (`at`) it was made for (ResponsesTranslator.text_frame)
    template: tuple[dict[str, Any], tuple[bytes, ...] | None] | None = None


def text_delta(at: dict[str, Any], text: str, logprobs: list[dict[str, Any]]) -> dict[str, Any]:
    """A piece of the open text part, as its `response.output_text.delta` event (less its
    sequence number)."""
    return {"type": "response.output_text.delta", **at, "delta": text, "logprobs": logprobs}


class ResponsesTranslator:
    """The Responses API's translator for the chat flow (gateway/chat.py)."""

    framing = NamedEventSSE()
    id_prefix = "resp_"

    def __init__(self, facts: DocumentFacts, errors: TranslatorFactory) -> None:
        """`errors`: the translator whose error bodies this API shares (OpenAI's)."""
        self.facts = facts
        self.errors = errors(facts)

    def read(self, body: Any) -> ChatRequest:
        return read(self.facts, body)

    # ----- a whole answer ------------------------------------------------------------------

    def completion(self, answer: Answer, completion: Completion) -> openai_doc.Response:
        native = completion.usage.frames
        if native and not any(choice.finish_reason == "content_filter" for choice in completion.choices):
            return as_clients(answer, native[0])  # type: ignore[return-value]
        output: list[dict[str, Any]] = []
        reason: FinishReason | None = None
        for choice in completion.choices[:1]:  # one choice: the Responses API has no `n`
            reason = choice.finish_reason
            if choice.text or choice.refusal is not None or not choice.tool_calls:
                output.append(
                    message_item(
                        item_id("msg_"),
                        "incomplete" if reason in INCOMPLETE else "completed",
                        choice.text if choice.text or choice.refusal is None else None,
                        choice.refusal,
                        logprob_entries(choice.logprobs),
                    )
                )
            output += [function_call_item(call) for call in choice.tool_calls]
        status = "incomplete" if reason in INCOMPLETE else "completed"
        body = response_body(answer, status, output, completion.usage, completion.served, reason)
        body["output_text"] = output_text(output)
        return body

    # ----- a stream ------------------------------------------------------------------------

    def new_stream_state(self) -> ResponseStream:
        return ResponseStream()

    def event(self, state: ResponseStream, payload: dict[str, Any]) -> dict[str, Any]:
        payload["sequence_number"] = state.sequence
        state.sequence += 1
        return payload

    def opening(self, answer: Answer, state: ResponseStream) -> list[dict[str, Any]]:
        state.started = True
        created = response_body(answer, "in_progress", [])
        return [
            self.event(state, {"type": "response.created", "response": created}),
            self.event(state, {"type": "response.in_progress", "response": created}),
        ]

    def chunks(self, answer: Answer, event: Event, state: ResponseStream) -> list[Any]:
        if state.native or event.frames is not None:
            return self.native_chunks(answer, event, state)
        out = self.opening(answer, state) if not state.started else []
        match event:
            case TextDelta(index=0, text=text, logprobs=logprobs):
                if text or logprobs:  # no logprob entries built for none: most of a stream
                    self.text(state, "output_text", text, logprob_entries(logprobs) if logprobs else [], out)
            case RefusalDelta(index=0, text=text):
                self.text(state, "refusal", text, [], out)
            case ToolCallDelta(index=0):
                out += self.close_message(state, "completed")
                out += self.function_call(state, event)
            case Finish(index=0, reason=reason):
                state.reason = reason
                out += self.close_message(state, "incomplete" if reason in INCOMPLETE else "completed")
            case ServedBy():
                state.served = ServedBy(
                    event.system_fingerprint or state.served.system_fingerprint,
                    event.service_tier or state.served.service_tier,
                )
            case Usage():
                out += self.close_message(state, "completed")
                status = "incomplete" if state.reason in INCOMPLETE else "completed"
                response = response_body(answer, status, state.output, event, state.served, state.reason)
                response["output_text"] = output_text(state.output)
                state.response = dict(response)
                out.append(self.event(state, {"type": f"response.{status}", "response": response}))
        return out

    def text_frame(self, answer: Answer, event: TextDelta, state: ResponseStream) -> bytes | None:
        """A text piece of the open text part, its delta event framed as `chunks` and the framing
        frame it, from the part's template (gateway/dialects/text_pieces.py), the piece kept and
        the sequence counted as `text` does; None where none applies (the part's first piece, an
        empty one, logprobs, a native pass-through)."""
        part = state.part
        if (
            part is None
            or part["type"] != "output_text"
            or not event.text
            or event.logprobs
            or event.index
            or state.native
            or event.frames is not None
        ):
            return None
        template = state.template
        if template is None or template[0] is not state.at:
            # the sequence number last, as `event` adds it
            marked = {**text_delta(state.at, TEXT_MARK, []), "sequence_number": NUMBER_MARK}
            template = state.template = (state.at, cut(self.framing.frame(marked), TEXT_MARK, NUMBER_MARK))
        if (parts := template[1]) is None:
            return None
        state.pieces.append(event.text)
        sequence = state.sequence
        state.sequence += 1
        return b"".join((parts[0], orjson.dumps(event.text), parts[1], b"%d" % sequence, parts[2]))

    def text(
        self, state: ResponseStream, kind: str, text: str, logprobs: list[dict[str, Any]], out: list[Any]
    ) -> None:
        """A piece of text or refusal, opening its message and part first when they are not open;
        its events go to `out`."""
        part = state.part
        if part is None or part["type"] != kind:  # else the open part goes on: most of a stream
            part = self.open_part(state, kind, out)
        state.pieces.append(text)
        if kind == "output_text":
            if logprobs:
                part["logprobs"] += logprobs
            out.append(self.event(state, text_delta(state.at, text, logprobs)))
        else:
            out.append(self.event(state, {"type": "response.refusal.delta", **state.at, "delta": text}))

    def open_part(self, state: ResponseStream, kind: str, out: list[Any]) -> dict[str, Any]:
        """A new content part of `kind`, in the open message (opened first when none is), after
        closing the open part of the other kind; the events that says go to `out`."""
        message = state.message
        if message is None:
            message = state.message = message_item(item_id("msg_"), "in_progress", None, None, [])
            state.output.append(message)
            out.append(self.item_event(state, "response.output_item.added", message))
        if state.part is not None:
            out += self.close_part(state)
        # where the part's events say it is: the message is the last output item while it is open
        state.at = {
            "item_id": message["id"],
            "output_index": len(state.output) - 1,
            "content_index": len(message["content"]),
        }
        part = state.part = (
            {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            if kind == "output_text"
            else {"type": "refusal", "refusal": ""}
        )
        message["content"].append(part)
        out.append(self.event(state, {"type": "response.content_part.added", **state.at, "part": dict(part)}))
        return part

    def item_event(self, state: ResponseStream, kind: str, item: dict[str, Any]) -> dict[str, Any]:
        copy = {**item, "content": list(item["content"])} if "content" in item else dict(item)
        return self.event(state, {"type": kind, "output_index": state.output.index(item), "item": copy})

    def close_part(self, state: ResponseStream) -> list[Any]:
        message, part = state.message, state.part
        if message is None or part is None:
            return []
        whole = "".join(state.pieces)
        state.pieces, state.part = [], None
        base = {
            "item_id": message["id"],
            "output_index": state.output.index(message),
            "content_index": len(message["content"]) - 1,
        }
        if part["type"] == "output_text":
            part["text"] = whole
            done = {"type": "response.output_text.done", **base, "text": whole, "logprobs": part["logprobs"]}
        else:
            part["refusal"] = whole
            done = {"type": "response.refusal.done", **base, "refusal": whole}
        return [
            self.event(state, done),
            self.event(state, {"type": "response.content_part.done", **base, "part": dict(part)}),
        ]

    def close_message(self, state: ResponseStream, status: str) -> list[Any]:
        message = state.message
        if message is None:
            return []
        out = self.close_part(state)
        message["status"] = status
        state.message = None
        out.append(self.item_event(state, "response.output_item.done", message))
        return out

    def function_call(self, state: ResponseStream, call: ToolCallDelta) -> list[Any]:
        item = function_call_item(call, "in_progress", "")
        state.output.append(item)
        index = len(state.output) - 1
        out = [self.item_event(state, "response.output_item.added", item)]
        base = {"item_id": item["id"], "output_index": index}
        if call.arguments:
            out.append(
                self.event(
                    state, {"type": "response.function_call_arguments.delta", **base, "delta": call.arguments}
                )
            )
        out.append(
            self.event(
                state,
                {
                    "type": "response.function_call_arguments.done",
                    **base,
                    "name": call.name,
                    "arguments": call.arguments,
                },
            )
        )
        item["arguments"], item["status"] = call.arguments, "completed"
        out.append(self.item_event(state, "response.output_item.done", item))
        return out

    def native_chunks(self, answer: Answer, event: Event, state: ResponseStream) -> list[Any]:
        """An upstream's own events as they came, the response's id and model the client's (the
        last one kept for the store); an event a policy step made instead (the content filter's
        finish) ends the stream with an error event."""
        state.native = True
        if state.stopped:
            return []
        frames = event.frames
        if frames is None:
            if isinstance(event, Finish) and event.reason == "content_filter":
                state.stopped = True
                stopped = {
                    "type": "error",
                    "code": "content_filter",
                    "message": "The answer was stopped by the content filter.",
                    "param": None,
                }
                return [self.event(state, stopped)]
            return []
        out = []
        for frame in frames:
            if "response" in frame:
                frame = {**frame, "response": as_clients(answer, frame["response"])}
                if frame.get("type") in ("response.completed", "response.incomplete"):
                    state.response = frame["response"]
            sequence = frame.get("sequence_number")
            if type(sequence) is int:
                state.sequence = sequence + 1
            out.append(frame)
        return out

    # ----- errors --------------------------------------------------------------------------

    def error(self, error: GatewayError, request_id: str) -> RenderedError:
        return self.errors.error(error, request_id)

    def stream_error(self, error: GatewayError, request_id: str, state: ResponseStream) -> Any:
        return self.event(
            state, {"type": "error", "code": error.code, "message": error.message, "param": error.param}
        )
