"""The embedded echo backend: deterministic, needs nothing, and says plainly it is not a model.

It honours the request's shape (max_tokens, stop and include_stop_str_in_output, n, seed,
logprobs, response_format, forced tool_choice, streaming, usage, a fingerprint) so every dialect
can be exercised end to end.

It calls a tool when asked to, so that agents (Claude Code, Codex CLI) can run a tool turn on
it: where tools are offered and not ruled out (`tool_choice` absent or auto), and the last
message is the user's and says `call NAME {…json…}` naming an offered tool, the answer is that
call with those arguments. The tool's result, the next turn, is echoed as text.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import json
import re
import zlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict

from backends.base import Capabilities, Param, taken
from gateway.core.canonical import (
    ChatRequest,
    CompletionTokensDetails,
    Event,
    Finish,
    FinishReason,
    Item,
    PromptTokensDetails,
    ServedBy,
    TextDelta,
    TokenLogprob,
    ToolCallDelta,
    TopLogprob,
    Usage,
    content_text,
)
from gateway.core.parameters import CATALOGUE

# The parameters that shape the echo; every other one a request can set is accepted and ignored.
SHAPING = frozenset(
    {
        "max_tokens",
        "stop",
        "include_stop_str_in_output",
        "n",
        "seed",
        "logprobs",
        "top_logprobs",
        "response_format",
        "tools",
        "tool_choice",
    }
)
# Every parameter of the catalogue that the gateway does not handle itself, none sent anywhere.
PARAMETERS: dict[str, Param] = {
    p.name: taken("shapes the echo" if p.name in SHAPING else "accepted and ignored: echo is not a model")
    for p in CATALOGUE
    if not p.handled
}
NO_PARAMETERS = {"type": "object", "properties": {}}
JSON_DECODER = json.JSONDecoder()
PREFIX = "[chatgate echo backend, not a language model] You said:"
# What echo says of every answer: one configuration, one tier, no reasoning and no cache (its
# zeros are true), so every dialect's fields for these are exercised end to end.
SERVED = ServedBy(system_fingerprint="fp_chatgate_echo", service_tier="default")
COMPLETION_DETAILS = CompletionTokensDetails(reasoning_tokens=0, audio_tokens=0)
PROMPT_DETAILS = PromptTokensDetails(cached_tokens=0, audio_tokens=0)
TOKEN = re.compile(r"\s*\S+|\s+")
ASKED_CALL = re.compile(r"\bcall ([A-Za-z0-9_.:-]{1,128}) (?=\{)")  # `call NAME {…}` in the user's text
INSTRUCTIONS = ("system", "developer")  # roles read past to the last user message
ASKED_CALLS_READ = 8  # the first few asks are read: a hostile text of many costs no more
MESSAGE_OVERHEAD_TOKENS = 3  # role and separators, as chat templates add them
SLICE_TOKENS = 256  # tokens per event of an answer that is not streamed
# A reply this short is split into tokens at once; a longer one a slice at a time, as it is sent
SPLIT_AT_ONCE_CHARS = 16 * 1024
COUNT_SLICE_CHARS = 256 * 1024  # prompt characters counted between two turns of the loop


def tokenize(text: str) -> list[str]:
    """Whitespace-led word pieces; joining them gives back the text."""
    return TOKEN.findall(text)


def count_tokens(text: str) -> int:
    """len(tokenize(text)), without building the list: one token per run of non-space (the
    space before it included), and one for trailing space."""
    return len(text.split()) + (1 if text and text[-1].isspace() else 0)


async def count_prompt_tokens(messages: list[dict[str, Any]]) -> int:
    """The prompt's tokens, counted a slice at a time with a turn for the loop between slices
    (a 4 MB prompt takes about 70 ms to count, far too long to hold the loop)."""
    total = 0
    budget = COUNT_SLICE_CHARS
    for message in messages:
        text = message_text(message)
        total += MESSAGE_OVERHEAD_TOKENS
        if len(text) <= budget:
            total += count_tokens(text)
            budget -= len(text)
            continue
        for start in range(0, len(text), COUNT_SLICE_CHARS):
            piece = text[start : start + COUNT_SLICE_CHARS]
            total += len(piece.split())
            # a word cut in two by the slice boundary was counted twice
            if start and piece[:1] and not piece[0].isspace() and not text[start - 1].isspace():
                total -= 1
            await asyncio.sleep(0)
        if text[-1].isspace():
            total += 1
        budget = COUNT_SLICE_CHARS
    return total


def message_text(message: dict[str, Any]) -> str:
    return content_text(message.get("content"))


def last_user_text(messages: list[dict[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            return message_text(message)
    return message_text(messages[-1]) if messages else ""


def asked_call(request: ChatRequest) -> ToolCallDelta | None:
    """The call the user's last message asks for (`call NAME {…}`), of a tool offered, if any.
    Instructions after it (Claude Code ends with a `system` message) do not hide it; a tool's
    result after it does."""
    if not request.tools or request.tool_choice not in (None, "auto"):
        return None
    last = next((m for m in reversed(request.messages) if m.get("role") not in INSTRUCTIONS), None)
    if last is None or last.get("role") != "user":
        return None
    text = message_text(last)
    offered = {(tool.get("function") or {}).get("name") for tool in request.tools}
    for match in itertools.islice(ASKED_CALL.finditer(text), ASKED_CALLS_READ):
        if match.group(1) not in offered:
            continue
        try:
            arguments, _ = JSON_DECODER.raw_decode(text, match.end())
        except ValueError:
            continue
        if isinstance(arguments, dict):
            return ToolCallDelta(
                index=0,
                call_index=0,
                id=f"call_{zlib.crc32(text.encode()):08x}",
                name=match.group(1),
                arguments=orjson.dumps(arguments).decode(),
            )
    return None


def instance_for(schema: Any, hint: str, depth: int = 0) -> Any:
    """A small JSON value matching a simple JSON schema (types, enum, properties, items)."""
    if not isinstance(schema, dict) or depth > 8:
        return hint
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        if schema.get(key):
            return instance_for(schema[key][0], hint, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object" or (kind is None and "properties" in schema):
        properties = schema.get("properties") or {}
        return {name: instance_for(sub, hint, depth + 1) for name, sub in properties.items()}
    if kind == "array":
        count = max(1, int(schema.get("minItems", 1)))
        return [instance_for(schema.get("items"), hint, depth + 1) for _ in range(count)]
    if kind == "integer":
        return int(schema.get("minimum", 0))
    if kind == "number":
        return float(schema.get("minimum", 0))
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    return hint


def token_logprob(token: str, position: int, seed: int, top: int) -> TokenLogprob:
    """A deterministic, well-formed logprob entry (the chosen token is the most likely)."""
    base = -(zlib.crc32(f"{seed}:{position}:{token}".encode()) % 2000) / 1000.0
    alternatives = [token.upper(), token.lower() + "s", token.strip() or "_", token[::-1], "…"]
    tops = [TopLogprob(token, base)]
    seen = {token}
    step = 1
    for alt in alternatives:
        if len(tops) >= top:
            break
        if alt in seen:
            continue
        seen.add(alt)
        tops.append(TopLogprob(alt, base - step * 0.75))
        step += 1
    while len(tops) < top:
        tops.append(TopLogprob(f"{token}#{step}", base - step * 0.75))
        step += 1
    return TokenLogprob(token, base, tops[:top])


class EchoOptions(BaseModel):
    """The echo backend takes no options: a key here is a mistake, refused at start."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class EchoBackend:
    name = "echo"
    capabilities = Capabilities(
        # every part is taken (echo answers the words; it reads no image, sound or file)
        modalities=frozenset({"text", "image", "audio", "file"}),
        custom_calls_in_history=True,
        # Echo honours the shape-giving parameters and accepts every sampling one (it does
        # not sample), so that every dialect's parameters can be exercised end to end.
        parameters=PARAMETERS,
        response_formats=frozenset({"text", "json_object", "json_schema"}),
        max_n=128,
        max_top_logprobs=20,
        # bounded like a model's answer when the request names no limit (a long prompt echoed
        # n times must not become hundreds of megabytes); any documented max_tokens is taken,
        # and server.max_response_bytes bounds what that may build
        default_max_tokens=4096,
    )

    def __init__(self, model: str = "echo", **options: Any) -> None:
        EchoOptions.model_validate(options)
        self.model = model

    async def aclose(self) -> None:
        return None

    def reply_for(self, request: ChatRequest) -> tuple[str, ToolCallDelta | None]:
        """The text (or forced tool call) this request gets, before max_tokens and stop."""
        heard = last_user_text(request.messages)
        forced = self.forced_tool(request)
        if forced is not None:
            function = forced.get("function", {})
            # a function without parameters takes none: it is called with an empty object
            arguments = instance_for(function.get("parameters") or NO_PARAMETERS, heard)
            call = ToolCallDelta(
                index=0,
                call_index=0,
                id=f"call_{zlib.crc32(heard.encode()):08x}",
                name=function.get("name", "tool"),
                arguments=orjson.dumps(arguments).decode(),
            )
            return "", call
        asked = asked_call(request)
        if asked is not None:
            return "", asked
        response_format = (request.response_format or {}).get("type", "text")
        if response_format == "json_object":
            return orjson.dumps({"echo": heard, "note": PREFIX}).decode(), None
        if response_format == "json_schema":
            schema = ((request.response_format or {}).get("json_schema") or {}).get("schema") or {}
            return orjson.dumps(instance_for(schema, heard)).decode(), None
        if request.extra:  # pass-through parameters: say what arrived, so callers can see it
            received = orjson.dumps(request.extra, option=orjson.OPT_SORT_KEYS).decode()
            return f"{PREFIX} {heard} [extra parameters: {received}]", None
        return f"{PREFIX} {heard}", None

    @staticmethod
    def forced_tool(request: ChatRequest) -> dict[str, Any] | None:
        choice = request.tool_choice
        if not request.tools or choice in (None, "none", "auto"):
            return None
        if isinstance(choice, dict) and choice.get("type") == "allowed_tools":
            allowed = choice.get("allowed_tools") or {}
            if allowed.get("mode") != "required":
                return None  # auto: echo answers with a message
            names = {(tool.get("function") or {}).get("name") for tool in allowed.get("tools") or ()}
            return next((t for t in request.tools if (t.get("function") or {}).get("name") in names), None)
        if choice == "required":
            return request.tools[0]
        if isinstance(choice, dict):
            wanted = (choice.get("function") or {}).get("name")
            for tool in request.tools:
                if (tool.get("function") or {}).get("name") == wanted:
                    return tool
        return None

    async def generate(self, request: ChatRequest) -> AsyncIterator[Item]:
        prompt_tokens = await count_prompt_tokens(request.messages)
        events = self.answer(request, prompt_tokens)
        if request.stream:
            for event in events:
                if event is TURN:
                    await asyncio.sleep(0)
                else:
                    yield event
            return
        # nobody sees the pieces of an answer that is not streamed: it goes as one batch (a
        # slice's worth at a time, for a long one)
        batch: list[Event] = []
        for event in events:
            if event is TURN:
                if batch:
                    yield batch
                    batch = []
                await asyncio.sleep(0)
            else:
                batch.append(event)
        yield batch

    def answer(self, request: ChatRequest, prompt_tokens: int) -> Iterator[Event | Turn]:
        """The answer's events, with a TURN wherever the event loop should get a turn: every
        slice of tokens, so a long answer never holds it (a stream gets one event per token, an
        answer not streamed one per slice)."""
        text, tool_call = self.reply_for(request)
        completion_tokens = 0
        seed = request.seed or 0
        words = Words(text, request)
        step, turn_every = (1, SLICE_TOKENS) if request.stream else (SLICE_TOKENS, 1)
        yield SERVED
        for index in range(request.n):
            if tool_call is not None:
                yield replace(tool_call, index=index)
                completion_tokens += len(tokenize(tool_call.arguments))
                yield Finish(index, "tool_calls")
                continue
            start = 0
            piece = words.between(start, start + step)
            while piece:
                logprobs = None
                if request.logprobs:
                    logprobs = [
                        token_logprob(token, start + offset, seed, request.top_logprobs)
                        for offset, token in enumerate(piece)
                    ]
                following = words.between(start + len(piece), start + len(piece) + step)
                yield TextDelta(index, "".join(piece), logprobs, last=not following)
                start += len(piece)
                piece = following
                if following and (start // step) % turn_every == 0:
                    yield TURN
            completion_tokens += start
            yield Finish(index, words.reason, words.stop if words.reason == "stop_sequence" else None)
            if index + 1 < request.n:
                yield TURN
        yield Usage(prompt_tokens, completion_tokens, COMPLETION_DETAILS, PROMPT_DETAILS)


class Turn(enum.Enum):
    """A point in an answer where the event loop gets a turn."""

    TURN = "turn"


TURN = Turn.TURN


class Words:
    """The reply's tokens after stop sequences and max_tokens, split off a slice at a time as
    they are sent (a long prompt echoed under a small limit, or to a client that leaves early,
    costs only what is sent) and kept for the next choice."""

    def __init__(self, text: str, request: ChatRequest) -> None:
        self.reason: FinishReason = "stop"
        self.stop: str | None = None  # the stop string that matched
        found = [(at, stop) for stop in request.stop if stop and (at := text.find(stop)) >= 0]
        if found:
            at, stop = min(found, key=lambda match: (match[0], -len(match[1])))
            keep = bool(request.options.get("include_stop_str_in_output"))  # OVMS's, for one
            text, self.reason = text[: at + len(stop) if keep else at], "stop_sequence"
            self.stop = stop
        self.limit = request.max_tokens
        self.split: list[str] = []
        self.rest: Iterator[re.Match[str]] | None = None
        if self.limit == 0 and text:  # nothing may be generated: the limit is reached at once
            self.reason = "length"
        elif len(text) <= SPLIT_AT_ONCE_CHARS:  # short: split whole, in C
            self.split = TOKEN.findall(text)
            if self.limit is not None and len(self.split) > self.limit:
                del self.split[self.limit :]
                self.reason = "length"
        else:
            self.rest = TOKEN.finditer(text)

    def between(self, start: int, stop: int) -> list[str]:
        """Tokens start..stop (fewer at the end)."""
        if self.limit is not None:
            stop = min(stop, self.limit)
        missing = stop - len(self.split)
        if missing > 0 and self.rest is not None:
            self.split += [match.group() for match in itertools.islice(self.rest, missing)]
            if len(self.split) < stop:
                self.rest = None  # the text is used up
            elif len(self.split) == self.limit and next(self.rest, None) is not None:
                self.rest, self.reason = None, "length"
        return self.split[start:stop]
