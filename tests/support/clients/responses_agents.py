"""The OpenAI Agents SDK with its default model (the Responses API) against a chatgate (run by
tests/system/test_responses_clients.py from the agent clients' venv):
`python responses_agents.py BASE_URL MODEL API_KEY PROMPT [FORCED]` runs an agent with a function
tool, `get_x` (no arguments), once with Runner.run and once with Runner.run_streamed, and prints
what each gave back as JSON.

FORCED (any value), for a real model that may not call a tool by itself and never ends a text
turn (the tests' tiny model: each of its answers in words runs to max_output_tokens, which the SDK
takes for a failure): the first turn is forced to call `get_x`, the second, which carries its
output, to call `done`, at which the run stops with `done`'s output as its final output."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
from typing import Any

from agents import (
    Agent,
    ModelSettings,
    Runner,
    StopAtTools,
    function_tool,
    set_default_openai_client,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

base_url, model, api_key, prompt, *forced = sys.argv[1:]
TOOL_OUTPUT = "the x is 42"
DONE_OUTPUT = "done"
calls: list[str] = []
agent: Agent[Any]


@function_tool
def get_x() -> str:
    """The x, the one the user asks for."""
    calls.append("get_x")
    if forced:  # the next turn ends the run
        agent.model_settings = dataclasses.replace(agent.model_settings, tool_choice="done")
    return TOOL_OUTPUT


@function_tool
def done() -> str:
    """Call when the answer is complete."""
    return DONE_OUTPUT


def items(result: Any) -> list[str]:
    return [item.type for item in result.new_items]


def new_agent() -> Agent[Any]:
    if not forced:
        return Agent(name="tester", instructions="Use the tool.", model=model, tools=[get_x])
    settings = ModelSettings(tool_choice="get_x", max_tokens=16, temperature=0)
    return Agent(
        name="tester",
        instructions="Use the tools.",
        model=model,
        tools=[get_x, done],
        model_settings=settings,
        reset_tool_choice=False,
        tool_use_behavior=StopAtTools(stop_at_tool_names=["done"]),
    )


async def main() -> dict[str, Any]:
    global agent
    set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    set_default_openai_client(client, use_for_tracing=False)

    agent = new_agent()
    ran = await Runner.run(agent, prompt, max_turns=4)
    ran_calls = len(calls)
    agent = new_agent()
    streamed = Runner.run_streamed(agent, prompt, max_turns=4)
    deltas = []
    async for event in streamed.stream_events():
        if event.type == "raw_response_event" and event.data.type == "response.output_text.delta":
            deltas.append(event.data.delta)
    return {
        "tool_output": TOOL_OUTPUT,
        "run": {"final_output": ran.final_output, "items": items(ran), "calls": ran_calls},
        "run_streamed": {
            "final_output": streamed.final_output,
            "items": items(streamed),
            "calls": len(calls) - ran_calls,
            "deltas": deltas,
        },
    }


print(json.dumps(asyncio.run(main())))
