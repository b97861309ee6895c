"""The Anthropic Messages dialect's probes, in its own shapes: `max_tokens` in every request, a
`Message` of content blocks, `stop_reason`, named events ending with `message_stop`, errors as
`{"type": "error", "error": {...}}`. Messages has no `n`, logprobs, JSON modes or seed."""

from __future__ import annotations

import re
from typing import Any

from gateway.probes import judges as j
from gateway.probes.probe_set import Answer, Judgement, Listing, Probe, ProbeSet, first_of

TOOL = {
    "name": "get_weather",
    "description": "The current weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def plain(**more: Any) -> dict[str, Any]:
    return {"messages": j.REPEAT, "max_tokens": 16, **j.GREEDY, **more}


def blocks(answer: Answer) -> list[dict[str, Any]]:
    found = answer.body.get("content") if isinstance(answer.body, dict) else None
    return [block for block in found if isinstance(block, dict)] if isinstance(found, list) else []


def text(answer: Answer) -> str:
    return "".join(b.get("text") or "" for b in blocks(answer) if b.get("type") == "text")


def stop_reason(answer: Answer) -> Any:
    return answer.body.get("stop_reason") if isinstance(answer.body, dict) else None


def judge_tools(answers: list[Answer]) -> Judgement:
    calls = [b for b in blocks(answers[0]) if b.get("type") == "tool_use"]
    if not calls:
        return "ignored", f"no tool_use block for a forced tool; text {j.snippet(text(answers[0]))}"
    if calls[0].get("name") != "get_weather":
        return "broken", f"called {calls[0].get('name')!r}, not the forced get_weather"
    return "honoured", "the forced get_weather call"


def judge_stop(answers: list[Answer]) -> Judgement:
    found = text(answers[0])
    at = found.lower().find(j.STOP)
    if at < 0:
        return "honoured", f"cut: the text ends before the stop sequence: {j.tail(found)}"
    if re.search(r"\w", found[at + len(j.STOP) :]):
        return "ignored", f"the text goes on past the stop sequence: {j.tail(found)}"
    kept = "stopped, but the text keeps the stop sequence, which belongs in stop_sequence"
    return "deviates", f"{kept}: {j.tail(found)}"


def judge_max_tokens(answers: list[Answer]) -> Judgement:
    reason = stop_reason(answers[0])
    if reason == "max_tokens":
        return "honoured", "stop_reason max_tokens"
    return "ignored", f"stop_reason {reason!r} for max_tokens 2: {j.snippet(text(answers[0]))}"


def event_types(answer: Answer) -> list[Any]:
    return [chunk.get("type") for chunk in answer.chunks if isinstance(chunk, dict)]


def judge_stream_end(answers: list[Answer]) -> Judgement:
    answer = answers[0]
    if not answer.streamed:
        return "broken", "stream: true was answered, but not as a stream"
    kinds = event_types(answer)
    if (
        kinds
        and kinds[-1] == "message_stop"
        and kinds.count("content_block_start") == kinds.count("content_block_stop")
    ):
        return "honoured", f"{len(kinds)} events, every block closed, then message_stop"
    return "ignored", f"{len(kinds)} events, not ended by message_stop with every block closed"


def judge_stream_usage(answers: list[Answer]) -> Judgement:
    answer = answers[0]
    if not answer.streamed:
        return "broken", "stream: true was answered, but not as a stream"
    for chunk in answer.chunks:
        usage = (
            chunk.get("usage") if isinstance(chunk, dict) and chunk.get("type") == "message_delta" else None
        )
        if isinstance(usage, dict) and isinstance(usage.get("output_tokens"), int):
            return "honoured", f"message_delta with usage ({usage['output_tokens']} output tokens)"
    return "ignored", "no message_delta with usage"


def anthropic_error(body: Any) -> bool:
    error = body.get("error") if isinstance(body, dict) else None
    return body.get("type") == "error" and isinstance(error, dict) and isinstance(error.get("type"), str)


ANTHROPIC = ProbeSet(
    dialect="anthropic",
    path="/v1/messages",
    plain=plain(),
    probes=(
        Probe(
            "tools", (plain(tools=[TOOL], tool_choice={"type": "tool", "name": "get_weather"}),), judge_tools
        ),
        Probe("stop", (plain(stop_sequences=[j.STOP], max_tokens=32),), judge_stop),
        Probe("max_tokens", (plain(max_tokens=2),), judge_max_tokens),
        Probe("stream_done", (plain(stream=True),), judge_stream_end),
        Probe("stream_usage", (plain(stream=True),), judge_stream_usage),
        Probe(
            "error_shape",
            ({"messages": "not a list", "max_tokens": 16},),
            j.error_shape_judge(anthropic_error, "{'type': 'error', 'error': {'type': ..., 'message': ...}}"),
            any_status=True,
        ),
        Probe("auth", (plain(),), j.judge_auth, any_status=True, keyless=True),
    ),
    error_message=j.refusal_words,
    listing=Listing("listModels", lambda body: first_of(body, "data", "id")),
    absent={
        "n": "Messages answers one message",
        "logprobs": "Messages has no logprobs",
        "json_object": "Messages has no JSON mode",
        "json_schema": "the gateway takes no output_config.format (dropped)",
        "seed": "Messages has no seed",
    },
)
