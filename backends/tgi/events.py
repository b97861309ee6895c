"""TGI's tokens → canonical events, one choice at a time: stop strings cut, logprobs kept, and
the one tool call TGI makes per choice assembled from its fragments."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import orjson

from backends.stop_strings import ending, held_back
from gateway.core.canonical import (
    ChatRequest,
    Event,
    Finish,
    FinishReason,
    TextDelta,
    TokenLogprob,
    ToolCallDelta,
    TopLogprob,
)
from gateway.core.errors import BadGateway

# TGI's finish reasons (both APIs) → canonical ones.
FINISH_REASONS: dict[str, FinishReason] = {
    "eos_token": "stop",
    "stop": "stop",
    "stop_sequence": "stop_sequence",
    "length": "length",
    "tool_calls": "tool_calls",
    "content_filter": "content_filter",
}

Piece = tuple[str, list[TokenLogprob] | None]


class StopTrimmer:
    """Holds back only text that could begin a stop string, and cuts the matched one at the end;
    or, when the matched one is kept (`cut` False), passes text on at once and only remembers
    enough of its end to tell a stop string from the end of sequence."""

    def __init__(self, stops: list[str], cut: bool = True) -> None:
        self.stops = [s for s in stops if s]
        self.cut = cut
        self.held: list[Piece] = []
        self.tail = ""  # the end of the text passed on, when kept

    def push(self, piece: Piece) -> list[Piece]:
        if not self.stops:
            return [piece]
        if not self.cut:
            longest = max(map(len, self.stops))
            self.tail = (self.tail + piece[0])[-longest:]
            return [piece]
        self.held.append(piece)
        text = "".join(t for t, _ in self.held)
        keep_from = len(text) - held_back(text, self.stops)
        released, position = [], 0
        while self.held and position + len(self.held[0][0]) <= keep_from:
            position += len(self.held[0][0])
            released.append(self.held.pop(0))
        return released

    def matched(self) -> str | None:
        """The stop string the text ends with, if any."""
        return ending("".join(t for t, _ in self.held) if self.cut else self.tail, self.stops)

    def ends_with_stop(self) -> bool:
        return self.matched() is not None

    def finish(self, cut_stop: bool) -> list[Piece]:
        held, self.held = self.held, []
        text = "".join(t for t, _ in held)
        matched = max((s for s in self.stops if text.endswith(s)), key=len, default="")
        if not cut_stop or not matched:
            return held
        cut_at, position, kept = len(text) - len(matched), 0, []
        for piece_text, logprobs in held:
            if position >= cut_at:
                break
            kept.append((piece_text[: cut_at - position], logprobs))
            position += len(piece_text)
        return kept


def split_tool_call(name: str | None, arguments: str) -> tuple[str | None, str]:
    """A streamed call's name and JSON arguments, also from TGI 2.x's raw `{"function": {"_name": …}}`."""
    text = arguments.strip()
    for candidate in (text, text[:-1] if text.endswith("}") else None):
        if candidate is None:
            continue
        try:
            parsed = orjson.loads(candidate)
        except orjson.JSONDecodeError:
            continue
        wrapped = parsed.get("function") if isinstance(parsed, dict) else None
        if isinstance(wrapped, dict) and "_name" in wrapped:
            name = wrapped.pop("_name")
            return name, orjson.dumps(wrapped).decode()
        return name, candidate
    return name, arguments


@dataclass(slots=True)
class ChoiceUsage:
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    tokens_seen: int = 0


class ChoiceEvents:
    """One choice's canonical events from TGI's tokens: stop strings cut, logprobs kept, one tool call."""

    def __init__(self, index: int, request: ChatRequest) -> None:
        self.index = index
        self.want_logprobs = request.logprobs
        self.top = request.top_logprobs
        include_stop = bool(request.options.get("include_stop_str_in_output"))
        self.trimmer = StopTrimmer(request.stop, cut=not include_stop)
        self.call_id = ""
        self.call_name: str | None = None
        self.call_arguments = ""
        self.finished = False

    def logprob(self, token: str, logprob: float | None, top: list[tuple[str, float]]) -> TokenLogprob:
        return TokenLogprob(token, logprob, [TopLogprob(t, lp) for t, lp in top[: self.top]])

    def text(self, text: str, logprobs: list[TokenLogprob] | None) -> list[Event]:
        if not text:
            return []
        if self.want_logprobs and logprobs is None:
            logprobs = [TokenLogprob(text, None)]
        piece = (text, logprobs if self.want_logprobs else None)
        return [TextDelta(self.index, t, lp) for t, lp in self.trimmer.push(piece)]

    def tool_fragment(self, call_id: str | None, name: str | None, arguments: str) -> None:
        self.call_id = self.call_id or call_id or ""
        self.call_name = self.call_name or name
        self.call_arguments += arguments

    @property
    def has_tool_call(self) -> bool:
        return bool(self.call_name or self.call_arguments)

    def finish(self, reason: FinishReason) -> list[Event]:
        self.finished = True
        if reason == "stop" and self.trimmer.ends_with_stop():
            reason = "stop_sequence"  # TGI 2.x's Messages API reported a stop string as "stop"
        stop = None
        if reason == "stop_sequence":  # which one (the request's only one, when the text can't say)
            stops = self.trimmer.stops
            stop = self.trimmer.matched() or (stops[0] if len(stops) == 1 else None)
        events: list[Event] = [
            TextDelta(self.index, t, lp)
            for t, lp in self.trimmer.finish(cut_stop=reason == "stop_sequence")
            if t
        ]
        if self.has_tool_call:
            name, arguments = split_tool_call(self.call_name, self.call_arguments)
            call_id = self.call_id if self.call_id not in ("", "0") else f"call_{uuid.uuid4().hex[:24]}"
            events.append(ToolCallDelta(self.index, 0, call_id, name or "", arguments))
            if reason == "stop":
                reason = "tool_calls"
        events.append(Finish(self.index, reason, stop))
        return events

    def end_of_stream(self) -> list[Event]:
        """The upstream stream ended: finish a complete tool call, or report the cut."""
        if self.finished:
            return []
        if self.has_tool_call:  # TGI 3.x does not send the finish of a streamed tool call
            _, arguments = split_tool_call(self.call_name, self.call_arguments)
            try:
                orjson.loads(arguments)
            except orjson.JSONDecodeError:
                pass
            else:
                return self.finish("tool_calls")
        raise BadGateway("TGI ended the stream before the generation finished.")


def finish_reason(tgi_reason: str) -> FinishReason:
    return FINISH_REASONS.get(tgi_reason, "stop")
