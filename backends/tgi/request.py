"""The canonical request → TGI's: which route serves it, its messages in TGI's shape, and the
canonical parameters that route's table (backends.tgi.tables) maps.

The route: the Messages API unless the request sets a parameter only the generate API has
(`RouteTables.generate_only`), or the deployment's `use_messages_api` fixes it. Tools need the
Messages API, so tools beside a generate-only parameter are refused (422 naming it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from backends.base import taken_or_asked
from backends.tgi.tables import RouteTables, grammar_for
from gateway.core.canonical import ChatRequest
from gateway.core.errors import UnprocessableContent
from gateway.core.parameters import requested, unasked


def tgi_content(content: Any) -> str | list[dict[str, Any]]:
    """OpenAI content → TGI's: a string, or text and image_url chunks when there are images."""
    if content is None or isinstance(content, str):
        return content or ""
    chunks: list[dict[str, Any]] = []
    for part in content:
        kind = part.get("type")
        if kind in ("text", "refusal"):
            chunks.append({"type": "text", "text": part.get(kind) or ""})
        elif kind == "image_url":
            chunks.append({"type": "image_url", "image_url": {"url": part["image_url"]["url"]}})
        else:
            raise UnprocessableContent(
                f"TGI takes text and image_url content parts, not '{kind}'.",
                param="messages",
                loc=["body", "messages"],
                value=kind,
            )
    if all(chunk["type"] == "text" for chunk in chunks):
        return "".join(chunk["text"] for chunk in chunks)
    return chunks


def tgi_arguments(arguments: Any) -> Any:
    """Tool-call arguments as TGI's templates want them: a JSON object when the string is one."""
    if isinstance(arguments, str):
        try:
            return orjson.loads(arguments)
        except orjson.JSONDecodeError:
            return arguments
    return arguments


def tgi_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI-shaped messages → TGI's Message schema (content XOR tool_calls; system roles)."""
    converted = []
    for message in messages:
        role = {"developer": "system", "function": "tool"}.get(message["role"], message["role"])
        tgi: dict[str, Any] = {"role": role}
        calls = message.get("tool_calls")
        if not calls and message.get("function_call"):
            calls = [{"id": "", "type": "function", "function": message["function_call"]}]
        if calls:  # TGI takes content or tool_calls; the calls matter to what follows
            tgi["tool_calls"] = [
                {
                    "id": call.get("id") or "",
                    "type": "function",
                    "function": {
                        "name": call["function"]["name"],
                        "arguments": tgi_arguments(call["function"].get("arguments")),
                    },
                }
                for call in calls
            ]
        else:
            tgi["content"] = tgi_content(message.get("content"))
        if message.get("name"):
            tgi["name"] = message["name"]
        if message.get("tool_call_id"):
            tgi["tool_call_id"] = message["tool_call_id"]
        converted.append(tgi)
    return converted


@dataclass(slots=True)
class Plan:
    """How one request goes to TGI: the route, TGI's messages, and what the route's table maps."""

    route: Literal["messages", "generate"]
    messages: list[dict[str, Any]]
    values: dict[str, Any]  # canonical parameters for the route's table (choice i: seed + i)
    knobs: dict[str, Any] = field(default_factory=dict)  # the generate-only ones that picked the route
    extra_body: dict[str, Any] = field(default_factory=dict)  # extra parameters for the Messages API


def refuse(message: str, name: str, value: Any) -> UnprocessableContent:
    return UnprocessableContent(message, param=name, loc=["body", name], value=value)


def plan_request(request: ChatRequest, tables: RouteTables) -> Plan:
    """Route and shape one request; the policy layer has already refused what the table lacks."""
    generate_only = tables.generate_only
    asked = requested(request)
    # a generate-only parameter may come as an extra parameter too (OpenAI's clients have no top_k)
    values = {**{k: v for k, v in request.extra.items() if k in generate_only}, **asked}
    # a parameter set to what asks for nothing (its document's default) picks no route, and
    # goes only where the route's table takes it
    quiet = unasked(request, asked)
    uses_tools = "tools" in values and request.tool_choice != "none"
    if not uses_tools:  # tool_choice "none": TGI is sent no tools at all
        values.pop("tools", None)
        values.pop("tool_choice", None)
    if uses_tools and grammar_for(request.response_format) is not None:
        raise refuse(
            "TGI takes response_format or tools in one request, not both.",
            "response_format",
            request.response_format,
        )
    knobs = {
        name: values[name]
        for name in generate_only
        if name in values and name not in quiet and tables.generate[name].converted(values[name]) is not None
    }
    extra = {k: v for k, v in request.extra.items() if k not in generate_only}
    mode = tables.use_messages_api
    to_generate = mode is False or (mode == "auto" and bool(knobs))
    if not to_generate:
        if knobs:
            name = next(iter(knobs))
            raise refuse(
                f"'{name}' needs TGI's generate API, and this deployment uses its Messages API only.",
                name, knobs[name],
            )  # fmt: skip
        # what is left of the generate-only parameters means "off"
        values = taken_or_asked(tables.messages, values, quiet)
        values = {k: v for k, v in values.items() if k not in generate_only}
        return Plan("messages", tgi_messages(request.messages), values, extra_body=extra)
    because = next(iter(knobs), "use_messages_api: false")
    if uses_tools and mode is False:
        raise UnprocessableContent(
            "Tools need TGI's Messages API, and this deployment uses its generate API only.",
            param="tools", loc=["body", "tools"], value=None,
        )  # fmt: skip
    if uses_tools:
        raise refuse(
            f"'{because}' needs TGI's generate API and tools need its Messages API: "
            "a request can have one or the other.",
            because, knobs[because],
        )  # fmt: skip
    if extra:
        name = next(iter(extra))
        raise refuse(
            f"'{name}' cannot be passed to TGI's generate API, which this request needs for '{because}'.",
            name, extra[name],
        )  # fmt: skip
    values = taken_or_asked(tables.generate, values, quiet)
    return Plan("generate", tgi_messages(request.messages), values, knobs)
