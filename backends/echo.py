"""The embedded echo backend: deterministic, needs nothing, and says plainly it is not a model.

It honours the request's shape (max_tokens, stop, n, seed, logprobs, response_format,
forced tool_choice, streaming, usage) so every dialect can be exercised end to end.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import orjson

from backends.base import Capabilities, same_names
from gateway.canonical import (
    ChatRequest,
    Event,
    Finish,
    TextDelta,
    TokenLogprob,
    ToolCallDelta,
    TopLogprob,
    Usage,
)
from gateway.policy.capabilities import GENERATION_OPTIONS

CANONICAL_PARAMETERS = (
    "max_tokens", "stop", "n", "seed", "logprobs", "top_logprobs", "temperature", "top_p",
    "frequency_penalty", "presence_penalty", "logit_bias", "tools", "tool_choice",
    "response_format", "user",
)  # fmt: skip
PREFIX = "[chatgate echo backend, not a language model] You said:"
TOKEN = re.compile(r"\s*\S+|\s+")
MESSAGE_OVERHEAD_TOKENS = 3  # role and separators, as chat templates add them


def tokenize(text: str) -> list[str]:
    """Whitespace-led word pieces; joining them gives back the text."""
    return TOKEN.findall(text)


def count_prompt_tokens(messages: list[dict[str, Any]]) -> int:
    total = 0
    for message in messages:
        total += MESSAGE_OVERHEAD_TOKENS + len(tokenize(message_text(message)))
    return total


def message_text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            part.get("text") or part.get("refusal") or "" for part in content if isinstance(part, dict)
        )
    return ""


def last_user_text(messages: list[dict[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            return message_text(message)
    return message_text(messages[-1]) if messages else ""


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


class EchoBackend:
    name = "echo"
    capabilities = Capabilities(
        modalities=frozenset({"text", "image", "audio"}),
        # Echo honours the shape-giving parameters and accepts every sampling one (it does
        # not sample), so that every dialect's parameters can be exercised end to end.
        parameters=same_names(*CANONICAL_PARAMETERS, *GENERATION_OPTIONS),
        response_formats=frozenset({"text", "json_object", "json_schema"}),
        max_n=128,
        max_top_logprobs=20,
        context_length=1 << 21,  # above the largest documented max_tokens plus a prompt
    )

    def __init__(self, model: str = "echo", **_: Any) -> None:
        self.model = model

    async def aclose(self) -> None:
        return None

    def reply_for(self, request: ChatRequest) -> tuple[str, ToolCallDelta | None]:
        """The text (or forced tool call) this request gets, before max_tokens and stop."""
        heard = last_user_text(request.messages)
        forced = self.forced_tool(request)
        if forced is not None:
            function = forced.get("function", {})
            arguments = instance_for(function.get("parameters") or {}, heard)
            call = ToolCallDelta(
                index=0,
                call_index=0,
                id=f"call_{zlib.crc32(heard.encode()):08x}",
                name=function.get("name", "tool"),
                arguments=orjson.dumps(arguments).decode(),
            )
            return "", call
        response_format = (request.response_format or {}).get("type", "text")
        if response_format == "json_object":
            return orjson.dumps({"echo": heard, "note": PREFIX}).decode(), None
        if response_format == "json_schema":
            schema = (request.response_format.get("json_schema") or {}).get("schema") or {}
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
        if choice == "required":
            return request.tools[0]
        if isinstance(choice, dict):
            wanted = (choice.get("function") or {}).get("name")
            for tool in request.tools:
                if (tool.get("function") or {}).get("name") == wanted:
                    return tool
        return None

    async def generate(self, request: ChatRequest) -> AsyncIterator[Event]:
        text, tool_call = self.reply_for(request)
        prompt_tokens = count_prompt_tokens(request.messages)
        completion_tokens = 0
        seed = request.seed or 0
        for index in range(request.n):
            if tool_call is not None:
                yield replace(tool_call, index=index)
                completion_tokens += len(tokenize(tool_call.arguments))
                yield Finish(index, "tool_calls")
                continue
            tokens, reason = self.cut(text, request)
            logprobs = None
            if request.logprobs:
                logprobs = [
                    token_logprob(token, position, seed, request.top_logprobs)
                    for position, token in enumerate(tokens)
                ]
            if not request.stream:  # nobody sees the pieces: one event per choice
                yield TextDelta(index, "".join(tokens), logprobs)
            else:
                for position, token in enumerate(tokens):
                    yield TextDelta(index, token, logprobs[position : position + 1] if logprobs else None)
            completion_tokens += len(tokens)
            yield Finish(index, reason)
        yield Usage(prompt_tokens, completion_tokens)

    @staticmethod
    def cut(text: str, request: ChatRequest) -> tuple[list[str], str]:
        """Apply stop sequences, then max_tokens, and say why generation ended."""
        reason = "stop"
        cut_at = min((p for s in request.stop if s and (p := text.find(s)) >= 0), default=-1)
        if cut_at >= 0:
            text, reason = text[:cut_at], "stop_sequence"
        tokens = tokenize(text)
        if request.max_tokens is not None and len(tokens) > request.max_tokens:
            tokens, reason = tokens[: request.max_tokens], "length"
        return tokens, reason
