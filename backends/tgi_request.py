"""The canonical request → TGI's: which route serves it, and its messages, tools, grammar and
sampling parameters in TGI's shape."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from backends.tgi_options import TGIOptions
from gateway.core.canonical import ChatRequest
from gateway.core.errors import UnprocessableContent

# Generate-API parameters the Messages API lacks: setting one routes the request to the generate API.
GENERATE_ONLY = ("top_k", "typical_p", "repetition_penalty", "truncate", "watermark")


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


def tgi_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI tools → TGI's (its FunctionDefinition calls the JSON schema `arguments`)."""
    converted = []
    for tool in tools:
        function = tool.get("function") or {}
        definition = {
            "name": function["name"],
            "arguments": function.get("parameters") or {"type": "object", "properties": {}},
        }
        if function.get("description"):
            definition["description"] = function["description"]
        converted.append({"type": "function", "function": definition})
    return converted


def grammar_for(response_format: dict[str, Any] | None) -> dict[str, Any] | None:
    """response_format → TGI's grammar `{type: json, value: schema}` (None for text)."""
    kind = (response_format or {}).get("type", "text")
    if kind == "json_object":
        return {"type": "json", "value": {"type": "object"}}
    if kind == "json_schema":
        schema = ((response_format or {}).get("json_schema") or {}).get("schema")
        return {"type": "json", "value": schema or {"type": "object"}}
    return None


def generate_knobs(request: ChatRequest) -> dict[str, Any]:
    """The generate-only parameters this request sets, with "off" values (top_k 0, typical_p 1) left out."""
    knobs = {}
    for name in GENERATE_ONLY:
        value = request.options.get(name, request.extra.get(name))
        if value is None or (name == "top_k" and value == 0) or (name == "typical_p" and value >= 1):
            continue
        knobs[name] = value
    return knobs


@dataclass(slots=True)
class Plan:
    """How one request goes to TGI: which route, and the TGI-shaped pieces of the body."""

    route: Literal["messages", "generate"]
    messages: list[dict[str, Any]]
    grammar: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    knobs: dict[str, Any] = field(default_factory=dict)
    extra_body: dict[str, Any] = field(default_factory=dict)


def plan_request(request: ChatRequest, options: TGIOptions) -> Plan:
    """Route and shape one request; the policy layer has already refused what the table lacks."""
    uses_tools = bool(request.tools) and request.tool_choice != "none"
    grammar = grammar_for(request.response_format)
    if uses_tools and grammar is not None:
        raise UnprocessableContent(
            "TGI takes response_format or tools in one request, not both.",
            param="response_format",
            loc=["body", "response_format"],
            value=request.response_format,
        )
    knobs = generate_knobs(request)
    extra = {k: v for k, v in request.extra.items() if k not in GENERATE_ONLY}
    mode = options.use_messages_api
    to_generate = mode is False or (mode == "auto" and bool(knobs))
    route: Literal["messages", "generate"] = "generate" if to_generate else "messages"
    if route == "messages" and knobs:
        name = next(iter(knobs))
        raise UnprocessableContent(
            f"'{name}' needs TGI's generate API, and this deployment uses its Messages API only.",
            param=name, loc=["body", name], value=knobs[name],
        )  # fmt: skip
    if route == "generate":
        because = next(iter(knobs), "use_messages_api: false")
        if uses_tools and mode is False:
            raise UnprocessableContent(
                "Tools need TGI's Messages API, and this deployment uses its generate API only.",
                param="tools", loc=["body", "tools"], value=None,
            )  # fmt: skip
        if uses_tools:
            raise UnprocessableContent(
                f"'{because}' needs TGI's generate API and tools need its Messages API: "
                "a request can have one or the other.",
                param=because, loc=["body", because], value=knobs[because],
            )  # fmt: skip
        if extra:
            name = next(iter(extra))
            raise UnprocessableContent(
                f"'{name}' cannot be passed to TGI's generate API, which this request needs "
                f"for '{because}'.",
                param=name, loc=["body", name], value=extra[name],
            )  # fmt: skip
    return Plan(
        route=route,
        messages=tgi_messages(request.messages),
        grammar=grammar,
        tools=tgi_tools(request.tools) if uses_tools else None,
        tool_choice=request.tool_choice if uses_tools else None,
        knobs=knobs,
        extra_body=extra,
    )


def sampling(request: ChatRequest) -> dict[str, Any]:
    """temperature / top_p as TGI takes them: 0 → greedy, top_p ≥ 1 → not sent."""
    top_p = request.top_p if request.top_p is not None and request.top_p < 1 else None
    return {"temperature": request.temperature, "top_p": top_p}
