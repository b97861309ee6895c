"""The OpenAI Agents SDK's `Agent()` with no model, in chat completions mode, against a chatgate
(run by tests/system/test_defaults_never_refused.py from the agent clients' venv):
`python agents_chat_defaults.py BASE_URL SETTINGS`. The SDK's default model is a GPT-5 one, whose
default settings it sends: `reasoning_effort` ("none" for the current ones) and `verbosity: "low"`.
SETTINGS: `default` keeps them; `effort-none` keeps only the reasoning effort "none". Prints the
run's final output, or the API error's status and body, as JSON."""

from __future__ import annotations

import json
import sys

from agents import (
    Agent,
    ModelSettings,
    Runner,
    set_default_openai_api,
    set_default_openai_client,
    set_tracing_disabled,
)
from openai import APIStatusError, AsyncOpenAI
from openai.types.shared import Reasoning

base_url, settings = sys.argv[1:]
set_tracing_disabled(True)
set_default_openai_api("chat_completions")
set_default_openai_client(AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0))
agent = Agent(name="tester", instructions="Answer briefly.")
if settings == "effort-none":
    agent.model_settings = ModelSettings(reasoning=Reasoning(effort="none"), max_tokens=16)
try:
    result = Runner.run_sync(agent, "Hello!")
    print(json.dumps({"final_output": str(result.final_output)}))
except APIStatusError as error:
    print(json.dumps({"status": error.status_code, "body": error.body}))
