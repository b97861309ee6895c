"""The OpenAI Agents SDK with its default model (the Responses API) against a chatgate (run by
tests/system/test_responses_clients.py from the agent clients' venv):
`python responses_agents.py BASE_URL MODEL API_KEY PROMPT [FORCED]` runs an agent with one
function tool, `get_x` (no arguments), once with Runner.run and once with Runner.run_streamed,
and prints what each gave back as JSON. FORCED (any value): the model settings force the tool
(a real model may not call it otherwise); the SDK lets the next turn choose again."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from agents import (
    Agent,
    ModelSettings,
    Runner,
    function_tool,
    set_default_openai_client,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

base_url, model, api_key, prompt, *forced = sys.argv[1:]
TOOL_OUTPUT = "the x is 42"
calls: list[str] = []


@function_tool
def get_x() -> str:
    """The x, the one the user asks for."""
    calls.append("get_x")
    return TOOL_OUTPUT


def items(result: Any) -> list[str]:
    return [item.type for item in result.new_items]


async def main() -> dict[str, Any]:
    set_tracing_disabled(True)
    set_default_openai_client(
        AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0), use_for_tracing=False
    )
    settings = ModelSettings(tool_choice="get_x", max_tokens=16, temperature=0) if forced else ModelSettings()
    agent = Agent(
        name="tester", instructions="Use the tool.", model=model, tools=[get_x], model_settings=settings
    )

    ran = await Runner.run(agent, prompt, max_turns=4)
    ran_calls = len(calls)
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
