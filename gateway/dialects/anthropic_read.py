"""Reading Anthropic's Messages request into the canonical (OpenAI-shaped) conversation: the
`system` prompt (text or text blocks) and `role: "system"` messages (Claude Code sends one) as
system messages at their place; content blocks as content parts (images as `image_url`, base64
as a `data:` URL, screened by the media policy like every image); an assistant's `tool_use`
blocks as its `tool_calls`; a user's `tool_result` blocks as `tool` messages ahead of the rest of
its turn; `tools` as functions and `tool_choice` as OpenAI's. Blocks and fields with no meaning
on a backend here (thinking, cache_control, server tools, `defer_loading`) are left out and
named in `dropped`, which the answer's dropped-params header lists."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from gateway.core.errors import BadRequest

TEXTLESS_BLOCKS = ("thinking", "redacted_thinking")


def cache_control(block: Mapping[str, Any], dropped: set[str]) -> None:
    if block.get("cache_control") is not None:
        dropped.add("cache_control")


def text_of(content: Any, dropped: set[str]) -> str:
    """Text, or text blocks joined (a system prompt, a tool's result)."""
    if isinstance(content, str):
        return content
    texts = []
    for block in content or ():
        cache_control(block, dropped)
        if block.get("type") == "text":
            texts.append(block.get("text", ""))
        else:
            dropped.add(f"{block.get('type')} blocks in tool results")
    return "\n".join(texts)


def image_part(block: Mapping[str, Any]) -> dict[str, Any]:
    source = block["source"]
    if source.get("type") == "base64":
        url = f"data:{source['media_type']};base64,{source['data']}"
    else:
        url = source["url"]
    return {"type": "image_url", "image_url": {"url": url}}


def refused_block(index: int, position: int, kind: str, role: str) -> BadRequest:
    where = f"messages.{index}.content.{position}.type"
    return BadRequest(
        f"A '{kind}' block may not be in a '{role}' message.",
        param=where,
        loc=["body", "messages", index, "content", position, "type"],
        value=kind,
    )


def user_turn(index: int, content: Any, dropped: set[str]) -> list[dict[str, Any]]:
    """A user message: its tool results as `tool` messages first, then its other blocks."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    results: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for position, block in enumerate(content):
        cache_control(block, dropped)
        kind = block["type"]
        if kind == "text":
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "image":
            parts.append(image_part(block))
        elif kind == "tool_result":
            text = text_of(block.get("content", ""), dropped)
            results.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": text})
        elif kind in TEXTLESS_BLOCKS:
            dropped.add(f"{kind} blocks")
        else:
            raise refused_block(index, position, kind, "user")
    if not parts:
        return results
    if len(parts) == 1 and parts[0]["type"] == "text":
        return [*results, {"role": "user", "content": parts[0]["text"]}]
    return [*results, {"role": "user", "content": parts}]


def assistant_turn(index: int, content: Any, dropped: set[str]) -> dict[str, Any]:
    """An assistant message: its text, and its `tool_use` blocks as tool calls."""
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for position, block in enumerate(content):
        cache_control(block, dropped)
        kind = block["type"]
        if kind == "text":
            texts.append(block["text"])
        elif kind == "tool_use":
            arguments = orjson.dumps(block.get("input") or {}).decode()
            calls.append(
                {
                    "id": block["id"],
                    "type": "function",
                    "function": {"name": block["name"], "arguments": arguments},
                }
            )
        elif kind in TEXTLESS_BLOCKS:
            dropped.add(f"{kind} blocks")
        else:
            raise refused_block(index, position, kind, "assistant")
    # text, empty beside tool calls (not null: llama-cpp-python's server refuses a null content)
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if calls:
        message["tool_calls"] = calls
    return message


def read_tools(tools: list[Mapping[str, Any]], dropped: set[str]) -> list[dict[str, Any]]:
    """Client tools as functions; server tools (a versioned `type`, no `input_schema`) dropped."""
    functions = []
    for tool in tools:
        cache_control(tool, dropped)
        if tool.get("defer_loading") is not None:
            dropped.add("tools.defer_loading")
        kind = tool.get("type")
        if kind not in (None, "custom") or "input_schema" not in tool:
            dropped.add(f"tools.{tool.get('name')}")
            continue
        function: dict[str, Any] = {"name": tool["name"], "parameters": tool["input_schema"]}
        if tool.get("description"):
            function["description"] = tool["description"]
        functions.append({"type": "function", "function": function})
    return functions


def read_tool_choice(choice: Mapping[str, Any] | None, tools: list[dict[str, Any]]) -> Any:
    if choice is None or not tools:
        return None
    kind = choice["type"]
    if kind == "tool":
        return {"type": "function", "function": {"name": choice["name"]}}
    return {"auto": "auto", "any": "required", "none": "none"}[kind]


def read_messages(
    body: Mapping[str, Any], dropped: set[str]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], Any]:
    """(the canonical messages, tools, tool choice) of a messages or count_tokens body."""
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if system:
        messages.append({"role": "system", "content": text_of(system, dropped)})
    for index, message in enumerate(body["messages"]):
        role, content = message["role"], message["content"]
        if "output_config" in message:
            dropped.add("messages.output_config")
        if role == "user":
            messages += user_turn(index, content, dropped)
        elif role == "assistant":
            messages.append(assistant_turn(index, content, dropped))
        else:  # "system": a system prompt at its place
            messages.append({"role": "system", "content": text_of(content, dropped)})
    tools = read_tools(body.get("tools") or [], dropped)
    return messages, tools, read_tool_choice(body.get("tool_choice"), tools)


def tool_text(tools: list[dict[str, Any]]) -> str:
    """The tools as the text a chat template puts in the prompt, about (for counting)."""
    return orjson.dumps(tools).decode()
