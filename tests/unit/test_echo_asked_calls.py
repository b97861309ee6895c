"""The echo backend calls a tool when the user's last message asks for it (`call NAME {…}`), so
an agent's tool turn can run on it; and only then."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson

from backends.echo import EchoBackend
from gateway.core.canonical import ChatRequest, Finish, TextDelta, ToolCallDelta

TOOLS = [
    {"type": "function", "function": {"name": "Bash", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "exec_command", "parameters": {"type": "object"}}},
]


def answer(messages: list[dict[str, Any]], **fields: Any) -> list[Any]:
    request = ChatRequest(model="echo", messages=messages, tools=fields.pop("tools", TOOLS), **fields)

    async def collect() -> list[Any]:
        events: list[Any] = []
        async for item in EchoBackend().generate(request):
            events.extend(item if isinstance(item, list) else [item])
        return events

    return asyncio.run(collect())


def calls(events: list[Any]) -> list[ToolCallDelta]:
    return [event for event in events if isinstance(event, ToolCallDelta)]


def test_an_asked_call_of_an_offered_tool_is_made_with_its_arguments() -> None:
    events = answer([{"role": "user", "content": 'please call exec_command {"cmd": "echo {ok}"} now'}])
    (call,) = calls(events)
    assert call.name == "exec_command"
    assert orjson.loads(call.arguments) == {"cmd": "echo {ok}"}
    assert any(isinstance(event, Finish) and event.reason == "tool_calls" for event in events)


def test_streamed_too() -> None:
    events = answer([{"role": "user", "content": 'call Bash {"command": "ls"}'}], stream=True)
    assert [call.name for call in calls(events)] == ["Bash"]


def test_instructions_after_the_ask_do_not_hide_it() -> None:
    """Claude Code's last message is its environment, as a `system` message after the user's."""
    asked = [
        {"type": "text", "text": "<system-reminder>…</system-reminder>"},
        {"type": "text", "text": 'call Bash {"command": "ls"}'},
    ]
    events = answer([{"role": "user", "content": asked}, {"role": "system", "content": "# Environment"}])
    assert [call.name for call in calls(events)] == ["Bash"]


def test_no_call_where_none_may_be_made() -> None:
    asked = 'call Bash {"command": "ls"}'
    cases: list[tuple[list[dict[str, Any]], dict[str, Any]]] = [
        ([{"role": "user", "content": 'call Nope {"a": 1}'}], {}),  # not offered
        ([{"role": "user", "content": "call Bash {not json"}], {}),
        ([{"role": "user", "content": "call Bash [1, 2]"}], {}),
        ([{"role": "user", "content": asked}], {"tool_choice": "none"}),
        ([{"role": "user", "content": asked}], {"tools": []}),
        # the tool's result came back: that turn is answered in words
        ([{"role": "user", "content": asked}, {"role": "tool", "tool_call_id": "c", "content": "ok"}], {}),
        ([{"role": "system", "content": asked}], {}),
    ]
    for messages, fields in cases:
        events = answer(messages, **fields)
        assert calls(events) == [], (messages, fields)
        assert any(isinstance(event, TextDelta) for event in events)


def test_a_text_of_many_asks_costs_no_more_than_a_few() -> None:
    hostile = 'call Bash {"a": "' + "call Bash {" * 200_000
    started = time.perf_counter()
    assert calls(answer([{"role": "user", "content": hostile}], max_tokens=1)) == []
    assert time.perf_counter() - started < 5
