"""The Responses API's probes (`POST /responses` under an OpenAI mount): the features it has, in its
own requests (`input`, `max_output_tokens`, `text.format`, flat function tools), judged from its
own answers (`output` items, `status`, named stream events ending with `response.completed`).
Its errors are OpenAI's."""

from __future__ import annotations

from typing import Any

from gateway.probes import judges as j
from gateway.probes.openai import openai_error
from gateway.probes.probe_set import Answer, Judgement, Probe, ProbeSet

PROMPT = f"Repeat exactly these words and nothing else: {j.WORDS}"
TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
FORCED = {"type": "function", "name": "get_weather"}
JSON_PROMPT = "Reply with a JSON object: the word hello."
LONG = f"Repeat exactly these words three times and nothing else: {j.WORDS}"


def plain(**more: Any) -> dict[str, Any]:
    return {"input": PROMPT, "max_output_tokens": 32, "store": False, **j.GREEDY, **more}


def output(answer: Answer) -> list[dict[str, Any]]:
    found = answer.body.get("output") if isinstance(answer.body, dict) else None
    return [item for item in found if isinstance(item, dict)] if isinstance(found, list) else []


def text(answer: Answer) -> str:
    return "".join(
        part.get("text", "")
        for item in output(answer)
        if item.get("type") == "message"
        for part in item.get("content") or ()
        if isinstance(part, dict) and part.get("type") == "output_text"
    )


def judge_tools(answers: list[Answer]) -> Judgement:
    calls = [item for item in output(answers[0]) if item.get("type") == "function_call"]
    if not calls:
        return "ignored", f"no function_call for a forced one; text {j.snippet(text(answers[0]))}"
    if calls[0].get("name") != "get_weather":
        return "broken", f"called {calls[0].get('name')!r}, not the forced get_weather"
    return "honoured", "the forced get_weather call"


def judge_json_object(answers: list[Answer]) -> Judgement:
    found = text(answers[0])
    if isinstance(j.parsed(found), dict):
        return "honoured", "a JSON object"
    return "ignored", f"not a JSON object: {j.snippet(found)}"


def judge_json_schema(answers: list[Answer]) -> Judgement:
    value = j.parsed(text(answers[0]))
    if isinstance(value, dict) and type(value.get("probe_answer")) is int and set(value) == {"probe_answer"}:
        return "honoured", "JSON matching the schema"
    return "ignored", f"not the schema's JSON: {j.snippet(text(answers[0]))}"


def judge_max_output_tokens(answers: list[Answer]) -> Judgement:
    body = answers[0].body if isinstance(answers[0].body, dict) else {}
    details = body.get("incomplete_details") or {}
    if body.get("status") == "incomplete" and details.get("reason") == "max_output_tokens":
        return "honoured", "status incomplete, for max_output_tokens"
    return "ignored", f"status {body.get('status')!r} for max_output_tokens 16: {j.snippet(text(answers[0]))}"


def judge_stream(answers: list[Answer]) -> Judgement:
    answer = answers[0]
    if not answer.streamed:
        return "broken", "stream: true was answered, but not as a stream"
    kinds = [chunk.get("type") for chunk in answer.chunks if isinstance(chunk, dict)]
    if kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1:] == ["response.completed"]:
        return "honoured", f"{len(kinds)} events, response.created to response.completed"
    return "ignored", f"{len(kinds)} events, from {kinds[:1]} to {kinds[-1:]}"


def judge_stream_usage(answers: list[Answer]) -> Judgement:
    last = answers[0].chunks[-1] if answers[0].chunks else None
    response = last.get("response") if isinstance(last, dict) else None
    usage = response.get("usage") if isinstance(response, dict) else None
    if isinstance(usage, dict) and isinstance(usage.get("output_tokens"), int):
        return "honoured", f"usage on the last event ({usage['output_tokens']} output tokens)"
    return "ignored", "no usage on the last event"


def error_shape(body: Any) -> bool:
    return openai_error(body)


weather = {"input": "What is the weather in Paris?", "tools": [TOOL], "store": False, **j.GREEDY}
schema_format = {"type": "json_schema", "name": "probe", "schema": j.SCHEMA, "strict": True}

RESPONSES = ProbeSet(
    dialect="responses",
    path="/responses",
    plain=plain(),
    probes=(
        Probe("tools", ({**weather, "tool_choice": FORCED},), judge_tools),
        Probe(
            "json_object",
            (plain(input=JSON_PROMPT, text={"format": {"type": "json_object"}}, max_output_tokens=48),),
            judge_json_object,
        ),
        Probe(
            "json_schema",
            (plain(input=JSON_PROMPT, text={"format": schema_format}, max_output_tokens=48),),
            judge_json_schema,
        ),
        Probe("max_tokens", (plain(input=LONG, max_output_tokens=16),), judge_max_output_tokens),
        Probe("stream_done", (plain(stream=True),), judge_stream),
        Probe("stream_usage", (plain(stream=True),), judge_stream_usage),
        Probe(
            "error_shape",
            ({"input": 3},),
            j.error_shape_judge(error_shape, "{'error': {'message': ...}}"),
            any_status=True,
        ),
        Probe("auth", (plain(),), j.judge_auth, any_status=True, keyless=True),
    ),
    error_message=j.refusal_words,
    absent={
        "n": "the Responses API has no n",
        "logprobs": "asked as include message.output_text.logprobs; not probed",
        "stop": "the Responses API has no stop",
        "seed": "the Responses API has no seed",
    },
)
