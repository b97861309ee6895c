"""The OpenAI dialect's probes: what upstreams speak, so also what a deployment probes.

Each request is small (a few tokens) and asks for what a model of any size does reliably
(repeat a list of words, answer a question with a forced tool call). Where an answer cannot
tell (a stop string the model never reached, a server that is deterministic anyway), the
verdict is `honoured`: a probe narrows a deployment only on evidence.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from backends.openai_compatible import content_text, error_message
from gateway.probes.probe_set import Answer, Judgement, Probe, ProbeSet

WORDS = "one two three four five six seven eight"
REPEAT = [{"role": "user", "content": f"Repeat exactly these words and nothing else: {WORDS}"}]
STOP = "five"
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
SCHEMA = {
    "type": "object",
    "properties": {"probe_answer": {"type": "integer"}},
    "required": ["probe_answer"],
    "additionalProperties": False,
}
SNIPPET = 60


def snippet(text: str) -> str:
    return repr(text if len(text) <= SNIPPET else text[:SNIPPET] + "…")


def tail(text: str) -> str:
    return repr(text if len(text) <= SNIPPET else "…" + text[-SNIPPET:])


def choices(answer: Answer) -> list[Any]:
    body = answer.body
    found = body.get("choices") if isinstance(body, dict) else None
    return found if isinstance(found, list) else []


def first(answer: Answer) -> dict[str, Any]:
    found = choices(answer)
    return found[0] if found and isinstance(found[0], dict) else {}


def message(answer: Answer) -> dict[str, Any]:
    found = first(answer).get("message")
    return found if isinstance(found, dict) else {}


def text(answer: Answer) -> str:
    return content_text(message(answer).get("content"))


def judge_n(answers: list[Answer]) -> Judgement:
    found = len(choices(answers[0]))
    if found == 2:
        return "honoured", "2 choices for n=2"
    if found == 1:
        return "ignored", "1 choice for n=2"
    return "broken", f"{found} choices for n=2"


def judge_logprobs(answers: list[Answer]) -> Judgement:
    logprobs = first(answers[0]).get("logprobs")
    tokens = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not isinstance(tokens, list) or not tokens or not isinstance(tokens[0], dict):
        return "ignored", "no logprobs in the answer"
    tops = tokens[0].get("top_logprobs")
    if not isinstance(tops, list) or not tops:
        return "ignored", "logprobs, but no top_logprobs"
    return "honoured", f"{len(tokens)} tokens, {len(tops)} top logprobs for the first"


def judge_tools(answers: list[Answer]) -> Judgement:
    calls = message(answers[0]).get("tool_calls")
    if not isinstance(calls, list) or not calls:
        return "ignored", f"no tool call for a forced one; text {snippet(text(answers[0]))}"
    function = calls[0].get("function") if isinstance(calls[0], dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if name != "get_weather":
        return "broken", f"called {name!r}, not the forced get_weather"
    return "honoured", "the forced get_weather call"


def parsed(found: str) -> Any:
    try:
        return orjson.loads(found)
    except orjson.JSONDecodeError:
        return None


def cut_object(answer: Answer) -> bool:
    """An object begun and cut at max_tokens: a small model under a JSON grammar (llama.cpp)
    may not close it in the tokens a probe allows, and one that ignores the grammar seldom
    begins with `{` to a prompt that does not say how."""
    return text(answer).lstrip().startswith("{") and first(answer).get("finish_reason") == "length"


def judge_json_object(answers: list[Answer]) -> Judgement:
    found = text(answers[0])
    if isinstance(parsed(found), dict):
        return "honoured", "a JSON object"
    if cut_object(answers[0]):
        return "honoured", f"a JSON object, cut at max_tokens: {snippet(found)}"
    return "ignored", f"not a JSON object: {snippet(found)}"


def judge_json_schema(answers: list[Answer]) -> Judgement:
    found = text(answers[0])
    value = parsed(found)
    if isinstance(value, dict) and type(value.get("probe_answer")) is int and set(value) == {"probe_answer"}:
        return "honoured", "JSON matching the schema"
    if cut_object(answers[0]) and found.lstrip().removeprefix("{").lstrip().startswith('"probe_answer"'):
        return "honoured", f"the schema's object, cut at max_tokens: {snippet(found)}"
    return "ignored", f"not the schema's JSON: {snippet(found)}"


def judge_stop(answers: list[Answer]) -> Judgement:
    found = text(answers[0])
    at = found.lower().find(STOP)
    if at < 0:
        return "honoured", f"cut: the text ends before the stop string: {tail(found)}"
    if re.search(r"\w", found[at + len(STOP) :]):
        return "ignored", f"the text goes on past the stop string: {tail(found)}"
    return "honoured", "kept: the text ends with the stop string"


def judge_seed(answers: list[Answer]) -> Judgement:
    once, twice = text(answers[0]), text(answers[1])
    if once == twice:
        return "honoured", "the same answer twice (temperature 1)"
    return "ignored", f"two answers for one seed: {snippet(once)}, {snippet(twice)}"


def judge_max_tokens(answers: list[Answer]) -> Judgement:
    reason = first(answers[0]).get("finish_reason")
    if reason == "length":
        return "honoured", "finish_reason length"
    return "ignored", f"finish_reason {reason!r} for max_tokens 2: {snippet(text(answers[0]))}"


def judge_stream_done(answers: list[Answer]) -> Judgement:
    answer = answers[0]
    if not answer.streamed:
        return "broken", "stream: true was answered, but not as a stream"
    if answer.done:
        return "honoured", f"{len(answer.chunks)} chunks, then [DONE]"
    return "ignored", f"{len(answer.chunks)} chunks, and no [DONE]"


def judge_stream_usage(answers: list[Answer]) -> Judgement:
    answer = answers[0]
    if not answer.streamed:
        return "broken", "stream: true was answered, but not as a stream"
    for chunk in answer.chunks:
        usage = chunk.get("usage") if isinstance(chunk, dict) else None
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            return "honoured", f"a usage chunk ({usage['completion_tokens']} completion tokens)"
    return "ignored", "no usage chunk for include_usage"


def judge_error_shape(answers: list[Answer]) -> Judgement:
    answer = answers[0]
    if answer.status == 0:
        return "broken", answer.failure
    if 200 <= answer.status < 300:
        return "ignored", f"HTTP {answer.status} for messages that are not a list"
    if not 400 <= answer.status < 500:
        return "broken", f"HTTP {answer.status} for messages that are not a list"
    body = answer.body
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return "honoured", f"HTTP {answer.status} with {{'error': {{'message': ...}}}}"
    return "broken", f"HTTP {answer.status}, not OpenAI's error shape: {answer.raw[:SNIPPET]!r}"


def judge_auth(answers: list[Answer]) -> Judgement:
    answer = answers[0]
    if answer.status in (401, 403):
        return "honoured", f"a key is asked for (HTTP {answer.status} without one)"
    if 200 <= answer.status < 300:
        return "ignored", "open: answered without a key"
    return "broken", answer.failure or f"HTTP {answer.status} without a key"


def plain(**more: Any) -> dict[str, Any]:
    return {"messages": REPEAT, "max_tokens": 16, **more}


def refusal_words(raw: bytes) -> str:
    return error_message(raw)[0]


OPENAI = ProbeSet(
    dialect="openai",
    path="/chat/completions",
    plain=plain(),
    probes=(
        Probe("n", (plain(n=2),), judge_n),
        Probe("logprobs", (plain(logprobs=True, top_logprobs=2),), judge_logprobs),
        Probe(
            "tools",
            (
                {
                    "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
                    "tools": [TOOL],
                    "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
                    "max_tokens": 64,
                },
            ),
            judge_tools,
        ),
        Probe(
            "json_object",
            (
                {
                    "messages": [{"role": "user", "content": "Reply with a JSON object: the word hello."}],
                    "response_format": {"type": "json_object"},
                    "max_tokens": 48,
                },
            ),
            judge_json_object,
        ),
        Probe(
            "json_schema",
            (
                {
                    "messages": [{"role": "user", "content": "Reply with a JSON object: the word hello."}],
                    "response_format": {
                        "type": "json_schema",
                        "json_schema": {"name": "probe", "schema": SCHEMA, "strict": True},
                    },
                    "max_tokens": 48,
                },
            ),
            judge_json_schema,
        ),
        Probe("stop", (plain(stop=[STOP], max_tokens=32),), judge_stop),
        Probe("seed", (plain(seed=1234, temperature=1.0),) * 2, judge_seed),
        Probe("max_tokens", (plain(max_tokens=2),), judge_max_tokens),
        Probe("stream_done", (plain(stream=True),), judge_stream_done),
        Probe(
            "stream_usage",
            (plain(stream=True, stream_options={"include_usage": True}),),
            judge_stream_usage,
        ),
        Probe("error_shape", ({"messages": "not a list"},), judge_error_shape, any_status=True),
        Probe("auth", (plain(),), judge_auth, any_status=True, keyless=True),
    ),
    error_message=refusal_words,
)
