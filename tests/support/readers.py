"""One reader per dialect, keyed by its name in the registry: how a table that runs over every
dialect builds a chat request in the dialect's shape and reads what comes back (the answer's text,
finish word, usage and tool calls, a stream's text, an error's message and code), so a table
never indexes `choices` itself.

A dialect with no reader of its own that reuses another's translator reads as that one; any other
fails `reader()` naming itself. A table that tests something only OpenAI-shaped chat has (`n`,
logprobs, `choices` chunks) selects its dialects with `chat_shaped()`, so a new dialect is either
covered or explicitly out, never a KeyError."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import orjson

from gateway.dialects.registry import DIALECTS


@dataclass(frozen=True)
class ChatReader:
    """A dialect whose bodies and answers are OpenAI's chat completions, with its own words."""

    dialect: str
    natural_end: str = "stop"  # its finish word for the end of the sequence
    json_lines: bool = False  # its stream is JSON lines (no `data:`, no `[DONE]`)
    asks_stream_usage: bool = True  # a stream carries usage when asked with stream_options
    always_stream_usage: bool = False  # a stream carries usage whether asked or not
    chat_shaped: bool = True  # `choices`, `n`, logprobs and chunks as OpenAI's

    @property
    def stream_usage(self) -> bool:
        """Whether a stream asked for with `body(stream=True)` carries the usage."""
        return self.asks_stream_usage or self.always_stream_usage

    # ----- requests -------------------------------------------------------------------------

    def body(
        self,
        content: Any = "Hello!",  # text, or content parts
        model: str | None = "echo",
        *,
        stream: bool = False,
        max_tokens: int | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        """The smallest chat request: one user message, plus `extra` as sent."""
        body: dict[str, Any] = {"messages": [{"role": "user", "content": content}]}
        if model is not None:
            body["model"] = model
        if stream:
            body["stream"] = True
            if self.asks_stream_usage:
                body["stream_options"] = {"include_usage": True}
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        return {**body, **extra}

    # ----- a whole answer -------------------------------------------------------------------

    def texts(self, answer: dict[str, Any]) -> dict[int, str]:
        return {c["index"]: c["message"].get("content") or "" for c in answer["choices"]}

    def text(self, answer: dict[str, Any]) -> str:
        (choice,) = answer["choices"]
        return choice["message"].get("content") or ""

    def finish(self, answer: dict[str, Any]) -> str | None:
        (choice,) = answer["choices"]
        return choice["finish_reason"]

    def usage(self, answer: dict[str, Any]) -> tuple[int, int] | None:
        usage = answer.get("usage")
        return (usage["prompt_tokens"], usage["completion_tokens"]) if usage else None

    def tool_calls(self, answer: dict[str, Any]) -> list[tuple[str, str]]:
        (choice,) = answer["choices"]
        calls = choice["message"].get("tool_calls") or ()
        return [(c["function"]["name"], c["function"]["arguments"]) for c in calls]

    # ----- a stream -------------------------------------------------------------------------

    def events(self, lines: Iterable[str]) -> list[dict[str, Any]]:
        """A stream's payloads, from its lines (an error event's payload included)."""
        if self.json_lines:
            return [orjson.loads(line) for line in lines if line.strip()]
        payloads = [line[5:].strip() for line in lines if line.startswith("data:")]
        return [orjson.loads(payload) for payload in payloads if payload != "[DONE]"]

    def streamed_text(self, events: Iterable[dict[str, Any]]) -> str:
        return "".join(
            (choice.get("delta") or {}).get("content") or ""
            for event in events
            for choice in event.get("choices") or ()
        )

    def streamed_finish(self, events: Iterable[dict[str, Any]]) -> str | None:
        finishes = [c["finish_reason"] for e in events for c in e.get("choices") or () if c["finish_reason"]]
        return finishes[-1] if finishes else None

    def streamed_usage(self, events: Iterable[dict[str, Any]]) -> tuple[int, int] | None:
        found = [self.usage(event) for event in events if event.get("usage")]
        return found[-1] if found else None

    # ----- errors ---------------------------------------------------------------------------

    def is_error(self, payload: dict[str, Any]) -> bool:
        """Whether an answer (or a stream's payload) is an error rather than a chat answer."""
        return "choices" not in payload

    def error_message(self, body: dict[str, Any]) -> str:
        error = body["error"]
        return error["message"] if isinstance(error, dict) else error

    def error_code(self, body: dict[str, Any]) -> str | int | None:
        return body["error"]["code"]

    def error_shaped(self, body: Any, status: int, headers: Mapping[str, str]) -> bool:
        """Whether `body` (with `headers`) is the dialect's own error answer for `status`."""
        return set(body["error"]) == {"message", "type", "param", "code"}


@dataclass(frozen=True)
class AzureReader(ChatReader):
    """Azure.Core's error: `{"error": {code, message}, "message", "status"}`, its code also in
    `x-ms-error-code`."""

    def error_message(self, body: dict[str, Any]) -> str:
        return body["message"]

    def error_shaped(self, body: Any, status: int, headers: Mapping[str, str]) -> bool:
        coded = bool(headers.get("x-ms-error-code"))
        return coded and body["status"] == status and {"error", "message"} <= set(body)


@dataclass(frozen=True)
class AlephAlphaReader(ChatReader):
    """Errors as `{"error": message, "code": UPPER_SNAKE}`."""

    def error_code(self, body: dict[str, Any]) -> str | int | None:
        return body["code"]

    def error_shaped(self, body: Any, status: int, headers: Mapping[str, str]) -> bool:
        return set(body) == {"error", "code"} and isinstance(body["error"], str) and body["code"].isupper()


@dataclass(frozen=True)
class LMIReader(ChatReader):
    """DJL Serving's errors: `{code: status, type, message}`."""

    def error_message(self, body: dict[str, Any]) -> str:
        return body["message"]

    def error_code(self, body: dict[str, Any]) -> str | int | None:
        return body["type"]

    def error_shaped(self, body: Any, status: int, headers: Mapping[str, str]) -> bool:
        return body["code"] == status and body["type"].endswith("Exception")


@dataclass(frozen=True)
class OVMSReader(ChatReader):
    """Errors as `{"error": message}`, with no code."""

    def error_code(self, body: dict[str, Any]) -> str | int | None:
        return None

    def error_shaped(self, body: Any, status: int, headers: Mapping[str, str]) -> bool:
        return set(body) == {"error"} and isinstance(body["error"], str)


def anthropic_block(part: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI-style content part as an Anthropic content block."""
    if part.get("type") != "image_url":
        return {"type": "text", "text": part.get("text", "")}
    url = part["image_url"]["url"]
    if url.startswith("data:"):
        media_type, _, data = url.removeprefix("data:").partition(";base64,")
        return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}
    return {"type": "image", "source": {"type": "url", "url": url}}


def anthropic_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI-style function tool as an Anthropic tool (other shapes as they are)."""
    function = tool.get("function")
    if tool.get("type") != "function" or not isinstance(function, dict):
        return tool
    converted = {"name": function["name"], "input_schema": function.get("parameters") or {"type": "object"}}
    if "description" in function:
        converted["description"] = function["description"]
    return converted


@dataclass(frozen=True)
class AnthropicReader(ChatReader):
    """Anthropic's Messages: `max_tokens` always sent, a `Message` of content blocks, named
    events, errors as `{"type": "error", "error": {type, message}, "request_id"}`."""

    natural_end: str = "end_turn"
    asks_stream_usage: bool = False
    always_stream_usage: bool = True
    chat_shaped: bool = False

    def body(
        self,
        content: Any = "Hello!",
        model: str | None = "echo",
        *,
        stream: bool = False,
        max_tokens: int | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        if isinstance(content, list):  # OpenAI-style parts → content blocks
            content = [anthropic_block(part) for part in content]
        if "tools" in extra:  # OpenAI-style function tools → Anthropic's
            extra["tools"] = [anthropic_tool(tool) for tool in extra["tools"]]
        body: dict[str, Any] = {
            "messages": [{"role": "user", "content": content}],
            "max_tokens": 256 if max_tokens is None else max_tokens,
        }
        if model is not None:
            body["model"] = model
        if stream:
            body["stream"] = True
        return {**body, **extra}

    def texts(self, answer: dict[str, Any]) -> dict[int, str]:
        return {0: self.text(answer)}

    def text(self, answer: dict[str, Any]) -> str:
        return "".join(block["text"] for block in answer["content"] if block["type"] == "text")

    def finish(self, answer: dict[str, Any]) -> str | None:
        return answer["stop_reason"]

    def usage(self, answer: dict[str, Any]) -> tuple[int, int] | None:
        usage = answer.get("usage")
        return (usage["input_tokens"], usage["output_tokens"]) if usage else None

    def tool_calls(self, answer: dict[str, Any]) -> list[tuple[str, str]]:
        return [
            (block["name"], orjson.dumps(block["input"]).decode())
            for block in answer["content"]
            if block["type"] == "tool_use"
        ]

    def streamed_text(self, events: Iterable[dict[str, Any]]) -> str:
        return "".join(
            event["delta"].get("text", "")
            for event in events
            if event.get("type") == "content_block_delta" and event["delta"]["type"] == "text_delta"
        )

    def streamed_finish(self, events: Iterable[dict[str, Any]]) -> str | None:
        finishes = [e["delta"]["stop_reason"] for e in events if e.get("type") == "message_delta"]
        return finishes[-1] if finishes else None

    def streamed_usage(self, events: Iterable[dict[str, Any]]) -> tuple[int, int] | None:
        found = [
            (e["usage"]["input_tokens"], e["usage"]["output_tokens"])
            for e in events
            if e.get("type") == "message_delta"
        ]
        return found[-1] if found else None

    def is_error(self, payload: dict[str, Any]) -> bool:
        return payload.get("type") == "error"

    def error_message(self, body: dict[str, Any]) -> str:
        return body["error"]["message"]

    def error_code(self, body: dict[str, Any]) -> str | int | None:
        return body["error"]["type"]

    def error_shaped(self, body: Any, status: int, headers: Mapping[str, str]) -> bool:
        return (
            body["type"] == "error"
            and set(body) == {"type", "error", "request_id"}
            and set(body["error"]) == {"type", "message"}
        )


READERS: dict[str, ChatReader] = {
    reader.dialect: reader
    for reader in (
        ChatReader("openai"),
        AzureReader("azure", asks_stream_usage=False, always_stream_usage=True),
        AlephAlphaReader("aleph_alpha"),
        LMIReader("lmi", natural_end="eos_token", json_lines=True, asks_stream_usage=False),
        OVMSReader("ovms"),
        AnthropicReader("anthropic"),
    )
}


def reader(dialect: str) -> ChatReader:
    """The dialect's reader; for a dialect with none that reuses another's translator (its class
    or the nearest ancestor of it), that dialect's. Any other fails here, naming itself."""
    if dialect in READERS:
        return READERS[dialect]
    for cls in DIALECTS[dialect].translator.__mro__:
        for other, registered_dialect in DIALECTS.items():
            if registered_dialect.translator is cls and other in READERS:
                return replace(READERS[other], dialect=dialect)
    raise AssertionError(f"{dialect}: add its reader to tests/support/readers.py")


def registered() -> list[str]:
    """Every registered dialect, each of which must have a reader (checked here)."""
    for name in DIALECTS:
        reader(name)
    return list(DIALECTS)


def chat_shaped() -> list[str]:
    """The registered dialects whose answers are OpenAI-shaped chat (choices, n, logprobs)."""
    return [name for name in DIALECTS if reader(name).chat_shaped]
