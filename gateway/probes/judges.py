"""What every dialect's probes share: the small requests (a few tokens each, asking for what a
model of any size does reliably: repeat a list of words, answer with a forced tool call) and the
judges of answers shaped as OpenAI's are (`choices`, `message`, `finish_reason`), which every
dialect chatgate serves keeps. A dialect's module (`openai.py`, `azure.py`, …) picks the probes
its document has, with its own error shape and stream framing.

Where an answer cannot tell (a stop string the model never reached, a server that is
deterministic anyway), the verdict is `honoured`: a probe narrows a deployment only on evidence.
A feature that works but answers otherwise than the document says (a stop string kept in the
text) `deviates`: not honoured, and it narrows nothing (a request for it is answered).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import orjson

from backends.http.bodies import content_text, error_message
from gateway.probes.probe_set import Answer, Judge, Judgement, Probe

JSON_LINES = "application/jsonlines"

WORDS = "one two three four five six seven eight"
REPEAT = [{"role": "user", "content": f"Repeat exactly these words and nothing else: {WORDS}"}]
STOP = "five"
# generation stopped there, but OpenAI's document says the returned text does not contain it
KEPT = "stopped, but the text keeps the stop string, which the document says it leaves out"
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
# Every probe asks for greedy output, so that a second run judges the same answers (a sampled
# one differs from run to run), but those of `seed` (which needs sampling to tell anything) and
# `n` (judged by the count alone; some servers refuse n > 1 with greedy output).
GREEDY = {"temperature": 0}


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
    """Token logprobs, each with its top alternatives (asked for with top_logprobs)."""
    tokens = logprob_tokens(answers[0])
    if not tokens:
        return "ignored", "no logprobs in the answer"
    tops = tokens[0].get("top_logprobs")
    if not isinstance(tops, list) or not tops:
        return "ignored", "logprobs, but no top_logprobs"
    return "honoured", f"{len(tokens)} tokens, {len(tops)} top logprobs for the first"


def judge_token_logprobs(answers: list[Answer]) -> Judgement:
    """Token logprobs alone (a dialect without top_logprobs: OVMS)."""
    tokens = logprob_tokens(answers[0])
    if not tokens:
        return "ignored", "no logprobs in the answer"
    if not all(isinstance(token.get("logprob"), int | float) for token in tokens):
        return "broken", "a token without a numeric logprob"
    return "honoured", f"{len(tokens)} tokens with their logprobs"


def logprob_tokens(answer: Answer) -> list[dict[str, Any]]:
    logprobs = first(answer).get("logprobs")
    tokens = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, dict) for t in tokens):
        return []
    return tokens


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
    return "deviates", f"{KEPT}: {tail(found)}"


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


def judge_json_lines_end(answers: list[Answer]) -> Judgement:
    """A JSON-lines stream (LMI's) has no end marker: its last line carries the finish reason."""
    answer = answers[0]
    if not answer.streamed or answer.media_type != JSON_LINES:
        return "broken", f"stream: true was answered as {answer.media_type or 'no stream'}, not {JSON_LINES}"
    last = answer.chunks[-1] if answer.chunks else None
    found = last.get("choices") if isinstance(last, dict) else None
    choice = found[0] if isinstance(found, list) and found and isinstance(found[0], dict) else {}
    reason = choice.get("finish_reason")
    if isinstance(reason, str):
        return "honoured", f"{len(answer.chunks)} lines, the last with finish_reason {reason!r}"
    return "ignored", f"{len(answer.chunks)} lines, and no finish_reason on the last"


def judge_stream_usage(answers: list[Answer]) -> Judgement:
    answer = answers[0]
    if not answer.streamed:
        return "broken", "stream: true was answered, but not as a stream"
    for chunk in answer.chunks:
        usage = chunk.get("usage") if isinstance(chunk, dict) else None
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            return "honoured", f"a usage chunk ({usage['completion_tokens']} completion tokens)"
    return "ignored", "no usage chunk for include_usage"


ErrorShape = Callable[[Any], bool]  # a 4xx body in the dialect's error shape?


def error_shape_judge(in_shape: ErrorShape, shape: str) -> Judge:
    """The judge of `messages` that are not a list: a 4xx whose body is the dialect's error
    (`shape` says which, for the detail)."""

    def judge_error_shape(answers: list[Answer]) -> Judgement:
        answer = answers[0]
        if answer.status == 0:
            return "broken", answer.failure
        if 200 <= answer.status < 300:
            return "ignored", f"HTTP {answer.status} for messages that are not a list"
        if not 400 <= answer.status < 500:
            return "broken", f"HTTP {answer.status} for messages that are not a list"
        if in_shape(answer.body):
            return "honoured", f"HTTP {answer.status} with {shape}"
        return "broken", f"HTTP {answer.status}, not the error shape {shape}: {answer.raw[:SNIPPET]!r}"

    return judge_error_shape


def judge_auth(answers: list[Answer]) -> Judgement:
    answer = answers[0]
    if answer.status in (401, 403):
        return "honoured", f"a key is asked for (HTTP {answer.status} without one)"
    if 200 <= answer.status < 300:
        return "ignored", "open: answered without a key"
    return "broken", answer.failure or f"HTTP {answer.status} without a key"


def plain(**more: Any) -> dict[str, Any]:
    """The plain request (the words to repeat, greedy), with `more`."""
    return {"messages": REPEAT, "max_tokens": 16, **GREEDY, **more}


def refusal_words(raw: bytes) -> str:
    return error_message(raw)[0]


# ----- the probes, as each dialect that has the feature sends it ------------------------------

FORCED_TOOL = {"type": "function", "function": {"name": "get_weather"}}
JSON_PROMPT = [{"role": "user", "content": "Reply with a JSON object: the word hello."}]


def n_probe(**more: Any) -> Probe:
    return Probe("n", (plain(n=2, temperature=1.0, **more),), judge_n)


def logprobs_probe() -> Probe:
    return Probe("logprobs", (plain(logprobs=True, top_logprobs=2),), judge_logprobs)


def tools_probe() -> Probe:
    weather = [{"role": "user", "content": "What is the weather in Paris?"}]
    body = {"messages": weather, "tools": [TOOL], "tool_choice": FORCED_TOOL, "max_tokens": 64, **GREEDY}
    return Probe("tools", (body,), judge_tools)


def json_object_probe() -> Probe:
    body = {"messages": JSON_PROMPT, "response_format": {"type": "json_object"}, "max_tokens": 48, **GREEDY}
    return Probe("json_object", (body,), judge_json_object)


def json_schema_probe() -> Probe:
    asked = {"type": "json_schema", "json_schema": {"name": "probe", "schema": SCHEMA, "strict": True}}
    body = {"messages": JSON_PROMPT, "response_format": asked, "max_tokens": 48, **GREEDY}
    return Probe("json_schema", (body,), judge_json_schema)


def stop_probe() -> Probe:
    return Probe("stop", (plain(stop=[STOP], max_tokens=32),), judge_stop)


def seed_probe() -> Probe:
    return Probe("seed", (plain(seed=1234, temperature=1.0),) * 2, judge_seed)


def max_tokens_probe() -> Probe:
    return Probe("max_tokens", (plain(max_tokens=2),), judge_max_tokens)


def stream_done_probe() -> Probe:
    return Probe("stream_done", (plain(stream=True),), judge_stream_done)


def stream_usage_probe(**asked: Any) -> Probe:
    """A usage chunk in the stream (`asked`: how the dialect asks for one, if it does)."""
    return Probe("stream_usage", (plain(stream=True, **asked),), judge_stream_usage)


def error_shape_probe(in_shape: ErrorShape, shape: str) -> Probe:
    judge = error_shape_judge(in_shape, shape)
    return Probe("error_shape", ({"messages": "not a list"},), judge, any_status=True)


def auth_probe() -> Probe:
    return Probe("auth", (plain(),), judge_auth, any_status=True, keyless=True)
