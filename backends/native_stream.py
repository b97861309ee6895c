"""Answers in the client's own dialect from an upstream that speaks it too (a native
pass-through of Anthropic's Messages or OpenAI's Responses): each streamed frame checked against
its dialect's event order and read into the canonical events the gateway's policy reads (text,
tool calls, the finish, the usage), each carrying the frame it stands for; frames with no
canonical meaning (the message's start, a block's start, thinking, pings) travel as `Passed`.

A stream that breaks its dialect's order (Messages: no `message_start` first, a delta for a block
never started, a second `message_start` …; Responses: no `response.created` first, a second one,
a part outside its item, events after the terminal one …) is an upstream failure (BadGateway),
never relayed as if it were whole. A whole answer becomes the same events, the upstream's body
carried on its Usage.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Literal, Protocol

import orjson

from backends.http.stream_decoders import StreamDecoder
from gateway.core.canonical import (
    CompletionTokensDetails,
    Event,
    Finish,
    FinishReason,
    Passed,
    PromptTokensDetails,
    RefusalDelta,
    TextDelta,
    ToolCallDelta,
    Usage,
)
from gateway.core.deadline import Deadline
from gateway.core.errors import BadGateway

Dialect = Literal["messages", "responses"]
PATHS: dict[Dialect, str] = {"messages": "/messages", "responses": "/responses"}

# Anthropic's stop reasons → canonical finish reasons
STOP_REASONS: dict[str, FinishReason] = {
    "end_turn": "stop",
    "stop_sequence": "stop_sequence",
    "max_tokens": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
    "pause_turn": "stop",
    "model_context_window_exceeded": "length",
}
# the Responses API's incomplete reasons → canonical finish reasons
INCOMPLETE_REASONS: dict[str, FinishReason] = {
    "max_output_tokens": "length",
    "content_filter": "content_filter",
}
# frames that only open what follows: held until the first that says something (a token, a
# thinking delta), so that the answer's status stays open until then
PREAMBLE = frozenset(
    {
        "message_start", "ping", "content_block_start", "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added",
    }
)  # fmt: skip
RESPONSES_TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})


def defect(dialect: str, what: str) -> BadGateway:
    """An upstream stream that breaks its dialect's event order."""
    return BadGateway(
        f"The upstream model server's {dialect} stream is broken: {what}.", code="UpstreamStreamBroken"
    )


def upstream_error(error: Any) -> BadGateway:
    """An error the upstream sent in place of (or in the middle of) its answer."""
    message = error.get("message") if isinstance(error, Mapping) else None
    said = message if isinstance(message, str) else orjson.dumps(error).decode()[:200]
    return BadGateway(f"The upstream model server reported an error: {said}")


def count(value: Any) -> int:
    return value if type(value) is int and value >= 0 else 0


class NativeStream(Protocol):
    ended: bool

    def feed(self, frame: Any) -> list[Event]: ...


def native_stream(dialect: Dialect) -> NativeStream:
    return MessagesStream() if dialect == "messages" else ResponsesStream()


# ----- Anthropic's Messages -------------------------------------------------------------------


class MessagesStream:
    """Checks a Messages stream's order and reads its frames: `message_start` first and once,
    each block started before its deltas and stopped once, no block open at `message_delta`,
    `message_stop` last; `ping` anywhere; an `error` event is the upstream's failure."""

    __slots__ = (
        "blocks", "cache_read", "cache_write", "calls", "ended", "finished", "input", "output", "started",
        "stopped",
    )  # fmt: skip

    def __init__(self) -> None:
        self.started = False
        self.finished = False  # message_delta seen
        self.ended = False  # message_stop seen
        self.blocks: dict[int, str] = {}  # open blocks: index → type
        self.stopped: set[int] = set()
        self.calls: dict[int, tuple[str, str, list[str]]] = {}  # tool_use blocks: id, name, input
        self.input = self.cache_read = self.cache_write = self.output = 0

    def defect(self, what: str) -> BadGateway:
        return defect("Messages", what)

    def usage_from(self, usage: Any) -> None:
        if not isinstance(usage, Mapping):
            return
        if "input_tokens" in usage and usage["input_tokens"] is not None:
            self.input = count(usage["input_tokens"])
        if usage.get("cache_read_input_tokens") is not None:
            self.cache_read = count(usage["cache_read_input_tokens"])
        if usage.get("cache_creation_input_tokens") is not None:
            self.cache_write = count(usage["cache_creation_input_tokens"])
        if usage.get("output_tokens") is not None:
            self.output = count(usage["output_tokens"])

    def usage(self, frames: list[Any]) -> Usage:
        details = PromptTokensDetails(cached_tokens=self.cache_read) if self.cache_read else None
        prompt = self.input + self.cache_read + self.cache_write
        return Usage(prompt, self.output, None, details, frames)

    def feed(self, frame: Any) -> list[Event]:
        if not isinstance(frame, Mapping):
            raise self.defect("an event that is not an object")
        kind = frame.get("type")
        if kind == "error":
            raise upstream_error(frame.get("error"))
        if self.ended:
            raise self.defect(f"'{kind}' after message_stop")
        if kind == "ping":
            return [Passed([frame])]
        if not self.started:
            if kind != "message_start":
                raise self.defect(f"'{kind}' before message_start")
            self.started = True
            message = frame.get("message")
            self.usage_from(message.get("usage") if isinstance(message, Mapping) else None)
            return [Passed([frame])]
        try:
            return self.read(kind, frame)
        except (KeyError, TypeError, AttributeError) as exc:
            raise self.defect(f"a malformed '{kind}' event ({type(exc).__name__}: {exc})") from None

    def read(self, kind: Any, frame: Mapping[str, Any]) -> list[Event]:
        if kind == "message_start":
            raise self.defect("a second message_start")
        if kind in ("content_block_start", "content_block_delta", "content_block_stop") and self.finished:
            raise self.defect(f"'{kind}' after message_delta")
        if kind == "content_block_start":
            index = frame["index"]
            if index in self.blocks or index in self.stopped:
                raise self.defect(f"block {index} started twice")
            block = frame["content_block"]
            self.blocks[index] = block["type"]
            if block["type"] == "tool_use":
                self.calls[index] = (block["id"], block["name"], [])
            return [Passed([frame])]
        if kind == "content_block_delta":
            index = frame["index"]
            if index not in self.blocks:
                raise self.defect(f"a delta for block {index}, which is not open")
            delta = frame["delta"]
            if delta["type"] == "text_delta":
                return [TextDelta(0, delta["text"], frames=[frame])]
            if delta["type"] == "input_json_delta" and index in self.calls:
                self.calls[index][2].append(delta["partial_json"])
            return [Passed([frame])]
        if kind == "content_block_stop":
            index = frame["index"]
            if self.blocks.pop(index, None) is None:
                raise self.defect(f"block {index} stopped but not open")
            self.stopped.add(index)
            call = self.calls.pop(index, None)
            if call is not None:
                call_id, name, pieces = call
                arguments = "".join(pieces)
                position = len(self.stopped) - 1
                return [ToolCallDelta(0, position, call_id, name, arguments, frames=[frame])]
            return [Passed([frame])]
        if kind == "message_delta":
            if self.blocks:
                raise self.defect(f"message_delta while block {min(self.blocks)} is open")
            if self.finished:
                raise self.defect("a second message_delta")
            self.finished = True
            self.usage_from(frame.get("usage"))
            delta = frame["delta"]
            reason = STOP_REASONS.get(delta.get("stop_reason") or "end_turn", "stop")
            stop = delta.get("stop_sequence") if reason == "stop_sequence" else None
            return [Finish(0, reason, stop, frames=[frame])]
        if kind == "message_stop":
            if not self.finished:
                raise self.defect("message_stop before message_delta")
            self.ended = True
            return [self.usage([frame])]
        return [Passed([frame])]  # an event this gateway does not know: the client's business


def messages_body(body: Any) -> list[Event]:
    """A whole Message: its text and tool calls, its finish, its usage carrying the body."""
    if not isinstance(body, Mapping) or body.get("type") == "error":
        raise upstream_error(body.get("error") if isinstance(body, Mapping) else body)
    try:
        if body["type"] != "message":
            raise TypeError(f"type {body['type']!r}, not 'message'")
        events: list[Event] = []
        calls = 0
        for block in body["content"]:
            if block["type"] == "text":
                events.append(TextDelta(0, block["text"], frames=[]))
            elif block["type"] == "tool_use":
                arguments = orjson.dumps(block.get("input") or {}).decode()
                events.append(ToolCallDelta(0, calls, block["id"], block["name"], arguments, frames=[]))
                calls += 1
        reason = STOP_REASONS.get(body.get("stop_reason") or "end_turn", "stop")
        stop = body.get("stop_sequence") if reason == "stop_sequence" else None
        events.append(Finish(0, reason, stop, frames=[]))
        reader = MessagesStream()
        reader.usage_from(body.get("usage"))
        events.append(reader.usage([body]))
        return events
    except (KeyError, TypeError, AttributeError) as exc:
        raise defect("Messages", f"a malformed message ({type(exc).__name__}: {exc})") from None


# ----- OpenAI's Responses ---------------------------------------------------------------------


def responses_usage(usage: Any, frames: list[Any]) -> Usage:
    if not isinstance(usage, Mapping):
        return Usage(0, 0, frames=frames)
    prompt_details = usage.get("input_tokens_details")
    output_details = usage.get("output_tokens_details")
    cached = prompt_details.get("cached_tokens") if isinstance(prompt_details, Mapping) else None
    reasoning = output_details.get("reasoning_tokens") if isinstance(output_details, Mapping) else None
    return Usage(
        count(usage.get("input_tokens")),
        count(usage.get("output_tokens")),
        CompletionTokensDetails(reasoning_tokens=reasoning) if type(reasoning) is int else None,
        PromptTokensDetails(cached_tokens=cached) if type(cached) is int else None,
        frames,
    )


def response_finish(response: Mapping[str, Any], called: bool) -> FinishReason:
    if response.get("status") == "incomplete":
        details = response.get("incomplete_details") or {}
        return INCOMPLETE_REASONS.get(str(details.get("reason")), "length")
    return "tool_calls" if called else "stop"


class ResponsesStream:
    """Checks a Responses stream's order and reads its frames: `response.created` first and once,
    each output item added before its parts and events and done once, each content part added
    before its deltas and done once, nothing open at the terminal event (completed, incomplete
    or failed), which is the last; an `error` event (or `response.failed`) is the upstream's
    failure.

    Where is what the client is owed: an event without the `output_index`, `content_index` or
    `sequence_number` the API requires (llama.cpp's server names items by `item_id` alone) gets
    them, from the item it names and the order things were added."""

    __slots__ = ("calls", "created", "done", "ended", "ids", "items", "open_parts", "parts", "sequence")

    def __init__(self) -> None:
        self.created = False
        self.ended = False
        self.items: dict[int, str] = {}  # open output items: output_index → type
        self.ids: dict[str, int] = {}  # items' ids → their output_index
        self.done: set[int] = set()
        self.parts: dict[int, int] = {}  # each item's content parts added so far
        self.open_parts: dict[int, int] = {}  # each item's open content part
        self.calls = 0
        self.sequence = 0

    def defect(self, what: str) -> BadGateway:
        return defect("Responses", what)

    def feed(self, frame: Any) -> list[Event]:
        if not isinstance(frame, dict):
            raise self.defect("an event that is not an object")
        kind = frame.get("type")
        if kind == "error":
            raise upstream_error(frame)
        if self.ended:
            raise self.defect(f"'{kind}' after the terminal event")
        sequence = frame.setdefault("sequence_number", self.sequence)
        self.sequence = (sequence if type(sequence) is int else self.sequence) + 1
        if not self.created:
            if kind != "response.created":
                raise self.defect(f"'{kind}' before response.created")
            self.created = True
            return [Passed([frame])]
        if kind == "response.created":
            raise self.defect("a second response.created")
        try:
            return self.read(kind, frame)
        except (KeyError, TypeError, AttributeError) as exc:
            raise self.defect(f"a malformed '{kind}' event ({type(exc).__name__}: {exc})") from None

    def open_item(self, kind: str, frame: dict[str, Any]) -> int:
        """The open item an event is about (its `output_index`, else the item its id names)."""
        index = frame.get("output_index")
        if index is None:
            item_id = frame["item_id"] if "item_id" in frame else frame["item"]["id"]
            index = frame["output_index"] = self.ids.get(item_id, -1)
        if index not in self.items:
            raise self.defect(f"'{kind}' for output item {index}, which is not open")
        return int(index)

    def open_part(self, kind: str, frame: dict[str, Any]) -> tuple[int, int]:
        """The open content part an event is about (its `content_index`, else its item's last)."""
        index = self.open_item(kind, frame)
        open_part = self.open_parts.get(index)
        part = frame.setdefault("content_index", -1 if open_part is None else open_part)
        if part != open_part:
            raise self.defect(f"'{kind}' for content part {part} of item {index}, which is not open")
        return index, part

    def read(self, kind: Any, frame: dict[str, Any]) -> list[Event]:
        if kind in RESPONSES_TERMINAL:
            response = frame["response"]
            if kind == "response.failed":
                raise upstream_error(response.get("error") or {"message": "the response failed"})
            if self.items:
                raise self.defect(f"'{kind}' while output item {min(self.items)} is open")
            self.ended = True
            reason = response_finish(response, self.calls > 0)
            return [Finish(0, reason, frames=[]), responses_usage(response.get("usage"), [frame])]
        if kind == "response.output_item.added":
            item = frame["item"]
            index = frame.setdefault("output_index", len(self.items) + len(self.done))
            if index in self.items or index in self.done:
                raise self.defect(f"output item {index} added twice")
            self.items[index] = item["type"]
            if isinstance(item.get("id"), str):
                self.ids[item["id"]] = index
            return [Passed([frame])]
        if kind == "response.output_item.done":
            index = self.open_item(kind, frame)
            if index in self.open_parts:
                raise self.defect(f"output item {index} done while a content part is open")
            del self.items[index]
            self.done.add(index)
            item = frame["item"]
            if item["type"] == "function_call":
                arguments = item.get("arguments") or ""
                call = ToolCallDelta(0, self.calls, item["call_id"], item["name"], arguments, frames=[frame])
                self.calls += 1
                return [call]
            return [Passed([frame])]
        if kind == "response.content_part.added":
            index = self.open_item(kind, frame)
            if index in self.open_parts:
                raise self.defect(f"a content part of item {index} added while another is open")
            added = self.parts.get(index, 0)
            part = frame.setdefault("content_index", added)
            if part != added:
                raise self.defect(f"content part {part} of item {index} added out of order")
            self.parts[index], self.open_parts[index] = added + 1, part
            return [Passed([frame])]
        if kind == "response.content_part.done":
            index, _ = self.open_part(kind, frame)
            del self.open_parts[index]
            return [Passed([frame])]
        if kind in ("response.output_text.delta", "response.refusal.delta"):
            self.open_part(kind, frame)
            delta = frame["delta"]
            if kind == "response.output_text.delta":
                return [TextDelta(0, delta, frames=[frame])]
            return [RefusalDelta(0, delta, frames=[frame])]
        if kind in ("response.output_text.done", "response.refusal.done"):
            self.open_part(kind, frame)
        elif "output_index" in frame or "item_id" in frame:
            self.open_item(kind, frame)  # an item's own event (arguments, reasoning …): inside it
        return [Passed([frame])]


def responses_body(body: Any) -> list[Event]:
    """A whole response: its text and function calls, its finish, its usage carrying the body."""
    if not isinstance(body, Mapping) or body.get("error") is not None:
        raise upstream_error(body.get("error") if isinstance(body, Mapping) else body)
    try:
        if body["object"] != "response":
            raise TypeError(f"object {body['object']!r}, not 'response'")
        if body.get("status") == "failed":
            raise upstream_error({"message": "the response failed"})
        events: list[Event] = []
        calls = 0
        for item in body["output"]:
            if item["type"] == "message":
                for part in item.get("content") or ():
                    if part["type"] == "output_text":
                        events.append(TextDelta(0, part["text"], frames=[]))
                    elif part["type"] == "refusal":
                        events.append(RefusalDelta(0, part["refusal"], frames=[]))
            elif item["type"] == "function_call":
                arguments = item.get("arguments") or ""
                events.append(ToolCallDelta(0, calls, item["call_id"], item["name"], arguments, frames=[]))
                calls += 1
        events.append(Finish(0, response_finish(body, calls > 0), frames=[]))
        events.append(responses_usage(body.get("usage"), [body]))
        return events
    except (KeyError, TypeError, AttributeError) as exc:
        raise defect("Responses", f"a malformed response ({type(exc).__name__}: {exc})") from None


def whole_answer(dialect: Dialect, body: Any) -> list[Event]:
    return messages_body(body) if dialect == "messages" else responses_body(body)


def says_something(event: Passed) -> bool:
    """Whether a passed frame says something of the answer (not only opens it)."""
    return any(not isinstance(frame, Mapping) or frame.get("type") not in PREAMBLE for frame in event.frames)


async def relayed(
    read: Callable[[], Awaitable[bytes]],
    decoder: StreamDecoder,
    reader: NativeStream,
    until: Deadline,
    deadline: float,
) -> AsyncIterator[list[Event]]:
    """The upstream's native stream as batches of events, as its frames arrive, each read by
    `until` (the caller's, which it closes: the first byte's deadline, moved to `deadline` once
    the answer says something). What only opens the answer (the message's start, a block's
    start, pings: PREAMBLE) is held and goes with the first event that says something, so that
    the answer's status is still open until then; the stream must end with its dialect's last
    event."""
    held: list[Event] | None = []
    while True:
        piece = await until.wait(read())
        payloads = decoder.feed(piece) if piece else decoder.close()
        batch: list[Event] = []
        for payload in payloads:
            try:
                frame = orjson.loads(payload)
            except orjson.JSONDecodeError:
                raise defect("native", f"an event that is not JSON: {bytes(payload[:80])!r}") from None
            batch += reader.feed(frame)
        if held is not None and batch:
            held += batch
            if any(type(event) is not Passed or says_something(event) for event in held):
                batch, held = held, None
                until.when = deadline
            else:
                batch = []
        if batch:
            yield batch
        if not piece or reader.ended:
            break
    if not reader.ended:
        raise BadGateway("The upstream closed the stream before the answer was finished.")
