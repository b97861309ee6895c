"""A Responses API body (`POST /responses`) read into the one canonical chat request: the input
items become chat messages, function tools become chat tools, `text.format` the response format;
what no backend here runs (hosted tools, their items) is dropped and named. What the answer echoes
of the request is kept beside it (`Echo`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.core.canonical import ChatRequest, NativeBody
from gateway.core.errors import BadRequest
from gateway.dialects.defaults import defaulted
from gateway.dialects.translator import DocumentFacts

# canonical roles for the Responses API's message roles (a backend's chat template may not know
# `developer`; it means what `system` means)
ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
# items that carry the model's reasoning: accepted, and not sent to a backend that cannot read them
UNSENT_ITEMS = frozenset({"reasoning"})
# the body's fields read as canonical parameters → their canonical names (`reasoning` and
# `text.verbosity` are echoed, not sent: a backend here has no effort or verbosity control)
PARAMETERS = {
    "max_output_tokens": "max_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "top_logprobs": "top_logprobs",
    "parallel_tool_calls": "parallel_tool_calls",
    "tools": "tools",
    "tool_choice": "tool_choice",
    "safety_identifier": "user",
    "user": "user",
}


@dataclass(slots=True)
class Echo:
    """What a response echoes of its request, and what the store needs of it."""

    body: Mapping[str, Any]  # the request as sent (what the response echoes is read from it)
    items: list[dict[str, Any]]  # the input as items (a string input: one user message)
    store: bool = True
    previous_response_id: str | None = None
    # where a continued conversation's history goes in the messages: after the instructions
    history_at: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)  # the stored items it continued
    references: bool = False  # whether the input names stored items by id (`item_reference`)


def unsupported(name: str, value: Any, why: str) -> BadRequest:
    return BadRequest(
        f"The parameter '{name}' is not supported here: {why}.",
        param=name,
        loc=["body", name],
        value=value,
        code="unsupported_parameter",
    )


def input_items(value: Any) -> list[dict[str, Any]]:
    """`input` as a list of items (a string is one user message)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    return list(value)


TEXT_PARTS = ("input_text", "output_text")


def content_parts(content: Any, where: str) -> str | list[dict[str, Any]]:
    """A message's content as chat content: a string as it is, text parts alone as one string,
    joined by newlines as vLLM joins them (as chat clients send text: servers such as llama.cpp's
    take no parts for a system message, and Codex's instructions are two), other parts as chat
    parts."""
    if isinstance(content, str):
        return content
    if content and all(part.get("type") in TEXT_PARTS for part in content):
        return "\n".join(part.get("text", "") for part in content)
    parts: list[dict[str, Any]] = []
    for index, part in enumerate(content):
        kind = part.get("type")
        if kind in ("input_text", "output_text"):
            parts.append({"type": "text", "text": part.get("text", "")})
        elif kind == "refusal":
            parts.append({"type": "text", "text": part.get("refusal", "")})
        elif kind == "input_image":
            url = part.get("image_url")
            if not url:
                raise unsupported(
                    f"{where}.content.{index}.file_id",
                    part.get("file_id"),
                    "images by file id (no Files API)",
                )
            image: dict[str, Any] = {"url": url}
            if part.get("detail") in ("low", "high", "auto"):
                image["detail"] = part["detail"]
            parts.append({"type": "image_url", "image_url": image})
        elif kind == "input_file":
            if part.get("file_data") is None:
                raise unsupported(
                    f"{where}.content.{index}", part.get("file_id") or part.get("file_url"),
                    "files by id or URL (no Files API); send file_data",
                )  # fmt: skip
            file = {"file_data": part["file_data"]}
            if part.get("filename"):
                file["filename"] = part["filename"]
            parts.append({"type": "file", "file": file})
    return parts


def text_of(content: Any) -> str:
    """Chat content as plain text (an assistant's message, a tool's output)."""
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content if p.get("type") == "text")


def is_reference(item: dict[str, Any]) -> bool:
    return item.get("type") == "item_reference" or (not item.get("type") and "role" not in item)


def messages_of(
    items: list[dict[str, Any]], dropped: list[str], where: str = "input"
) -> list[dict[str, Any]]:
    """Responses items → chat messages: consecutive function calls join one assistant message,
    each output is a `tool` message; reasoning is left out, other tools' items dropped and named."""
    messages: list[dict[str, Any]] = []
    for index, item in enumerate(items):
        kind = item.get("type") or ("message" if "role" in item else "item_reference")
        at = f"{where}.{index}"
        if kind == "message":
            role = ROLES[item["role"]]
            content = content_parts(item["content"], at)
            if role == "assistant":
                content = text_of(content)
            messages.append({"role": role, "content": content})
        elif kind == "function_call":
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":  # its text and calls, one message
                last.setdefault("tool_calls", []).append(call)
            else:
                # content "", not null: servers such as llama-cpp-python's refuse a null content
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item["output"]
            text = output if isinstance(output, str) else text_of(content_parts(output, f"{at}.output"))
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": text})
        elif kind == "item_reference":
            pass  # resolved before admission, from the stored conversation (keeping.expand)
        elif kind not in UNSENT_ITEMS:
            dropped.append(f"{at}:{kind}")
    return messages


def tools_of(tools: list[dict[str, Any]], dropped: list[str]) -> list[dict[str, Any]]:
    """Function tools as chat tools; the others (hosted, namespaces, custom) dropped and named."""
    found = []
    for tool in tools:
        if tool.get("type") != "function":
            dropped.append(f"tools:{tool.get('type')}")
            continue
        function: dict[str, Any] = {"name": tool["name"]}
        if tool.get("description") is not None:
            function["description"] = tool["description"]
        function["parameters"] = tool.get("parameters") or {"type": "object", "properties": {}}
        if tool.get("strict") is not None:
            function["strict"] = tool["strict"]
        found.append({"type": "function", "function": function})
    return found


def tool_choice_of(choice: Any, tools: list[dict[str, Any]], dropped: list[str]) -> Any:
    """`tool_choice` in chat's words; a hosted tool's choice is dropped with its tool."""
    if choice is None or isinstance(choice, str):
        return choice
    kind = choice.get("type")
    if kind == "function" and choice.get("name"):
        return {"type": "function", "function": {"name": choice["name"]}}
    if kind == "allowed_tools":
        return choice.get("mode", "auto")
    dropped.append(f"tool_choice:{kind}")
    return None


def response_format_of(text: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """`text.format` as chat's `response_format`."""
    form = (text or {}).get("format")
    if not form or form.get("type") == "text":
        return None
    if form["type"] == "json_object":
        return {"type": "json_object"}
    schema = {"name": form["name"], "schema": form["schema"]}
    if form.get("description") is not None:
        schema["description"] = form["description"]
    if form.get("strict") is not None:
        schema["strict"] = form["strict"]
    return {"type": "json_schema", "json_schema": schema}


def read(facts: DocumentFacts, body: Mapping[str, Any]) -> ChatRequest:
    """A validated `POST /responses` body → the canonical request, its `echo` kept on it."""
    for name, treatment in facts.unsupported.items():
        value = body.get(name)
        if value is None or value is False or treatment != "rejected":
            continue
        raise unsupported(name, value, "this gateway keeps no conversations, prompts or background runs")
    dropped: list[str] = []
    items = input_items(body.get("input"))
    messages: list[dict[str, Any]] = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": body["instructions"]})
    history_at = len(messages)
    messages += messages_of(items, dropped)
    tools = tools_of(list(body.get("tools") or []), dropped)
    choice = tool_choice_of(body.get("tool_choice"), tools, dropped) if tools else None
    options: dict[str, Any] = {}
    if tools and body.get("parallel_tool_calls") is False:
        options["parallel_tool_calls"] = False
    if body.get("prompt_cache_key"):  # as chat completions carry it (routing's affinity key)
        options["prompt_cache_key"] = body["prompt_cache_key"]
    extra = {name: value for name, value in body.items() if name not in facts.fields}
    top_logprobs = body.get("top_logprobs") or 0
    logprobs = bool(top_logprobs) or "message.output_text.logprobs" in (body.get("include") or ())
    store = body.get("store")
    return ChatRequest(
        model=body.get("model"),
        messages=messages,
        stream=bool(body.get("stream")),
        include_usage=True,
        max_tokens=None if body.get("max_output_tokens") is None else int(body["max_output_tokens"]),
        temperature=body.get("temperature"),
        top_p=body.get("top_p"),
        logprobs=logprobs,
        top_logprobs=int(top_logprobs),
        response_format=response_format_of(body.get("text")),
        tools=tools,
        tool_choice=choice,
        user=body.get("safety_identifier") or body.get("user"),
        options=options,
        extra=extra,
        defaulted=defaulted(facts.defaults, body, PARAMETERS),
        dropped=dropped,
        echo=Echo(
            body=body,
            items=items,
            store=store is not False,
            previous_response_id=body.get("previous_response_id"),
            history_at=history_at,
            references=any(is_reference(item) for item in items),
        ),
        native=NativeBody("responses", body, frozenset(extra)),  # type: ignore[arg-type]
    )
