"""The OpenAI translator (gateway/dialects/openai.py), table by table: the parameters openai.yaml
defines, completions with `model` and `refusal` (null, or the model's refusal), what the backend
said of the answer (system_fingerprint, service_tier, usage details), legacy function calls,
logprob bytes as given, OpenAI's stream (`usage: null` before the usage chunk), and errors as
`{"error": {message, type, param, code}}` with a hidden deployment answered as an unknown model.
The spellings and stream rules it shares with every dialect are in test_shape.py."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.core.canonical import (
    Choice,
    Finish,
    RefusalDelta,
    ServedBy,
    TextDelta,
)
from gateway.core.errors import GatewayError, NotFound
from gateway.fleet.router import Router
from tests.unit.dialects import cases
from tests.unit.dialects.cases import (
    LOGPROBS,
    MISSING_LOGPROB,
    USAGE,
    USAGE_BODY,
    WEATHER_CALL,
    WEATHER_CALL_BODY,
    AnswerCase,
    CompletionCase,
    ErrorCase,
    ReadCase,
    StreamCase,
)

TRANSLATOR = cases.translator("openai")
WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}

# ----- read -------------------------------------------------------------------------------------

READS = [
    ReadCase("minimal body", {}, {}),
    ReadCase("model", {"model": "gpt-4o"}, {"model": "gpt-4o"}),
    ReadCase(
        "stream with usage",
        {"stream": True, "stream_options": {"include_usage": True}},
        {"stream": True, "include_usage": True},
    ),
    ReadCase("n", {"n": 2}, {"n": 2}),
    ReadCase("max_tokens", {"max_tokens": 5}, {"max_tokens": 5}),
    ReadCase(
        "max_completion_tokens wins over max_tokens",
        {"max_tokens": 5, "max_completion_tokens": 7},
        {"max_tokens": 7},
    ),
    ReadCase("stop as a string", {"stop": "END"}, {"stop": ["END"]}),
    ReadCase(
        "sampling numbers",
        {"seed": 7, "temperature": 0.5, "top_p": 0.9, "frequency_penalty": 0.1, "presence_penalty": -0.1},
        {"seed": 7, "temperature": 0.5, "top_p": 0.9, "frequency_penalty": 0.1, "presence_penalty": -0.1},
    ),
    ReadCase("logit_bias", {"logit_bias": {"50256": -100}}, {"logit_bias": {"50256": -100}}),
    ReadCase(
        "logprobs and top_logprobs",
        {"logprobs": True, "top_logprobs": 3},
        {"logprobs": True, "top_logprobs": 3},
    ),
    ReadCase(
        "response_format",
        {"response_format": {"type": "json_object"}},
        {"response_format": {"type": "json_object"}},
    ),
    ReadCase(
        "tools and tool_choice",
        {"tools": [WEATHER_TOOL], "tool_choice": "required"},
        {"tools": [WEATHER_TOOL], "tool_choice": "required"},
    ),
    ReadCase(
        "functions and function_call become tools and tool_choice",
        {"functions": [WEATHER_TOOL["function"]], "function_call": {"name": "get_weather"}},
        {
            "tools": [WEATHER_TOOL],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "legacy_functions": True,
        },
    ),
    ReadCase("user", {"user": "u-1"}, {"user": "u-1"}),
    ReadCase(
        "informational parameters are options",
        {"metadata": {"team": "a"}, "store": False, "service_tier": "auto"},
        {
            "options": {"metadata": {"team": "a"}, "store": False, "service_tier": "auto"},
            "defaulted": frozenset({"store", "service_tier"}),  # the document's defaults
        },
    ),
    ReadCase(
        "newer generation parameters are options",
        {
            "parallel_tool_calls": False,
            "modalities": ["text"],
            "audio": {"voice": "alloy", "format": "wav"},
            "prediction": {"type": "content", "content": "x"},
            "reasoning_effort": "low",
        },
        {
            "options": {
                "parallel_tool_calls": False,
                "modalities": ["text"],
                "audio": {"voice": "alloy", "format": "wav"},
                "prediction": {"type": "content", "content": "x"},
                "reasoning_effort": "low",
            }
        },
    ),
    ReadCase(
        "OpenAI's current fields (openapi 2.3.0) are options",
        {
            "verbosity": "low",
            "web_search_options": {"search_context_size": "low"},
            "moderation": {"model": "omni-moderation-latest"},
            "prompt_cache_key": "k",
            "prompt_cache_retention": "24h",
            "prompt_cache_options": {"ttl": "1h"},
            "safety_identifier": "s",
            "reasoning_effort": "xhigh",
            "service_tier": "priority",
        },
        {
            "options": {
                "verbosity": "low",
                "web_search_options": {"search_context_size": "low"},
                "moderation": {"model": "omni-moderation-latest"},
                "prompt_cache_key": "k",
                "prompt_cache_retention": "24h",
                "prompt_cache_options": {"ttl": "1h"},
                "safety_identifier": "s",
                "reasoning_effort": "xhigh",
                "service_tier": "priority",
            }
        },
    ),
    ReadCase(
        "a parameter openai.yaml does not define is extra, even one another dialect defines",
        {"mood": "calm", "top_k": "forty"},
        {"extra": {"mood": "calm", "top_k": "forty"}},
    ),
]


# ----- completion -------------------------------------------------------------------------------


def message(content: str | None, **more: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": content, **more, "refusal": None}


COMPLETIONS = [
    CompletionCase(
        "text",
        [Choice(0, "Hello", finish_reason="stop")],
        [{"index": 0, "message": message("Hello"), "logprobs": None, "finish_reason": "stop"}],
    ),
    CompletionCase(
        "a tool call, no text: content null",
        [Choice(0, "", tool_calls=[WEATHER_CALL], finish_reason="tool_calls")],
        [
            {
                "index": 0,
                "message": message(None, tool_calls=[WEATHER_CALL_BODY]),
                "logprobs": None,
                "finish_reason": "tool_calls",
            }
        ],
    ),
    CompletionCase(
        "a tool call after text keeps the text",
        [Choice(0, "Let me look.", tool_calls=[WEATHER_CALL], finish_reason="tool_calls")],
        [
            {
                "index": 0,
                "message": message("Let me look.", tool_calls=[WEATHER_CALL_BODY]),
                "logprobs": None,
                "finish_reason": "tool_calls",
            }
        ],
    ),
    CompletionCase(
        "logprobs with UTF-8 bytes",
        [Choice(0, "Hé!", logprobs=LOGPROBS, finish_reason="length")],
        [
            {
                "index": 0,
                "message": message("Hé!"),
                "logprobs": {
                    "content": cases.LOGPROBS_CONTENT,
                    "refusal": None,
                },
                "finish_reason": "length",
            }
        ],
    ),
    CompletionCase(
        "a logprob the backend could not give is -9999.0, OpenAI's number for it",
        [Choice(0, "?", logprobs=MISSING_LOGPROB, finish_reason="stop")],
        [
            {
                "index": 0,
                "message": message("?"),
                "logprobs": {
                    "content": cases.MISSING_LOGPROB_CONTENT,
                    "refusal": None,
                },
                "finish_reason": "stop",
            }
        ],
    ),
    CompletionCase(
        "bytes as the backend gave them: null for a special token, a list kept",
        [Choice(0, "é", logprobs=cases.NO_BYTES + cases.GIVEN_BYTES, finish_reason="stop")],
        [
            {
                "index": 0,
                "message": message("é"),
                "logprobs": {
                    "content": [
                        {
                            "token": "<|end|>",
                            "logprob": -0.1,
                            "bytes": None,
                            "top_logprobs": [{"token": "<|end|>", "logprob": -0.1, "bytes": None}],
                        },
                        {"token": "é", "logprob": -0.2, "bytes": [195, 169], "top_logprobs": []},
                    ],
                    "refusal": None,
                },
                "finish_reason": "stop",
            }
        ],
    ),
    CompletionCase(
        "a refusal: content null, the refusal and its logprobs in their fields",
        [Choice(0, "", refusal=cases.REFUSAL, refusal_logprobs=LOGPROBS[1:], finish_reason="stop")],
        [
            {
                "index": 0,
                "message": {"role": "assistant", "content": None, "refusal": cases.REFUSAL},
                "logprobs": {
                    "content": None,
                    "refusal": [cases.BANG_CONTENT],
                },
                "finish_reason": "stop",
            }
        ],
    ),
    CompletionCase(
        "a legacy functions request gets function_call",
        [Choice(0, "", tool_calls=[WEATHER_CALL], finish_reason="tool_calls")],
        [
            {
                "index": 0,
                "message": message(None, function_call=WEATHER_CALL_BODY["function"]),
                "logprobs": None,
                "finish_reason": "function_call",
            }
        ],
        request={"legacy_functions": True},
    ),
    CompletionCase(
        "two choices, an unfinished one read as stopped",
        [Choice(0, "a", finish_reason="length"), Choice(1, "b")],
        [
            {"index": 0, "message": message("a"), "logprobs": None, "finish_reason": "length"},
            {"index": 1, "message": message("b"), "logprobs": None, "finish_reason": "stop"},
        ],
    ),
]


ANSWERS = [
    AnswerCase("nothing said", ServedBy(), USAGE, {"usage": USAGE_BODY}),
    AnswerCase(
        "fingerprint, tier and usage details, as the backend said them",
        cases.SERVED,
        cases.DETAILED_USAGE,
        {
            "service_tier": "default",
            "system_fingerprint": "fp_44709d6fcb",
            "usage": {
                **USAGE_BODY,
                "completion_tokens_details": {"reasoning_tokens": 7, "audio_tokens": 0},
                "prompt_tokens_details": {"cached_tokens": 4},
            },
        },
    ),
]


# ----- chunks -----------------------------------------------------------------------------------


def chunk(choice: dict[str, Any] | None = None, **more: Any) -> dict[str, Any]:
    return {
        "id": cases.ANSWER_ID,
        "object": "chat.completion.chunk",
        "created": cases.CREATED,
        "model": cases.MODEL,
        "choices": [] if choice is None else [choice],
        **more,
    }


def choice(delta: dict[str, Any], finish_reason: str | None = None, logprobs: Any = None) -> dict[str, Any]:
    return {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}


ASKED = {"usage": None}  # with include_usage, every chunk before the usage one has `usage: null`
FINGERPRINT = {"service_tier": "default", "system_fingerprint": "fp_44709d6fcb"}

STREAMS = [
    StreamCase(
        "text, finish and usage: usage null until the usage chunk",
        [TextDelta(0, "Hel"), TextDelta(0, "lo"), Finish(0, "stop"), USAGE],
        [
            chunk(choice({"role": "assistant", "content": ""}), **ASKED),
            chunk(choice({"content": "Hel"}), **ASKED),
            chunk(choice({"content": "lo"}), **ASKED),
            chunk(choice({}, "stop"), **ASKED),
            chunk(usage=USAGE_BODY),
        ],
        include_usage=True,
    ),
    StreamCase(
        "fingerprint and tier in every chunk once the backend said them; usage details",
        [cases.SERVED, TextDelta(0, "Hi"), Finish(0, "stop"), cases.DETAILED_USAGE],
        [
            chunk(choice({"role": "assistant", "content": ""}), **FINGERPRINT, **ASKED),
            chunk(choice({"content": "Hi"}), **FINGERPRINT, **ASKED),
            chunk(choice({}, "stop"), **FINGERPRINT, **ASKED),
            chunk(
                **FINGERPRINT,
                usage={
                    **USAGE_BODY,
                    "completion_tokens_details": {"reasoning_tokens": 7, "audio_tokens": 0},
                    "prompt_tokens_details": {"cached_tokens": 4},
                },
            ),
        ],
        include_usage=True,
    ),
    StreamCase(
        "a refusal streams in delta.refusal, its logprobs in logprobs.refusal",
        [RefusalDelta(0, "I can't", LOGPROBS[1:]), RefusalDelta(0, " help."), Finish(0, "stop")],
        [
            chunk(choice({"role": "assistant", "content": ""})),
            chunk(
                choice(
                    {"refusal": "I can't"},
                    logprobs={
                        "content": None,
                        "refusal": [cases.BANG_CONTENT],
                    },
                )
            ),
            chunk(choice({"refusal": " help."})),
            chunk(choice({}, "stop")),
        ],
    ),
    StreamCase(
        "a legacy functions request streams function_call",
        [WEATHER_CALL, Finish(0, "tool_calls")],
        [
            chunk(
                choice({"role": "assistant", "content": None, "function_call": WEATHER_CALL_BODY["function"]})
            ),
            chunk(choice({}, "function_call")),
        ],
        request={"legacy_functions": True},
    ),
    StreamCase("usage not asked for: no chunk", [USAGE], []),
    StreamCase(
        "a tool call",
        [WEATHER_CALL, Finish(0, "tool_calls")],
        [
            chunk(
                choice(
                    {"role": "assistant", "content": None, "tool_calls": [{"index": 0, **WEATHER_CALL_BODY}]}
                )
            ),
            chunk(choice({}, "tool_calls")),
        ],
    ),
    StreamCase(
        "logprobs are an object, as in the completion",
        [TextDelta(0, "!", [LOGPROBS[1]])],
        [
            chunk(choice({"role": "assistant", "content": ""})),
            chunk(
                choice(
                    {"content": "!"},
                    logprobs={
                        "content": [cases.BANG_CONTENT],
                        "refusal": None,
                    },
                )
            ),
        ],
    ),
]


# ----- error ------------------------------------------------------------------------------------


def error_body(error: GatewayError, kind: str, param: str | None, code: str) -> dict[str, Any]:
    return {"error": {"message": error.message, "type": kind, "param": param, "code": code}}


# the errors only this dialect answers its own way; those every dialect answers with the same
# status (its words for them in SHARED_ERRORS) are in test_answers.py
ERRORS = [
    ErrorCase(
        "hidden deployment is 404, as an unknown model",
        cases.HIDDEN_DEPLOYMENT,
        404,
        {
            "error": {
                "message": "The model 'text-only' does not exist or you do not have access to it.",
                "type": "not_found_error",
                "param": "model",
                "code": "model_not_found",
            }
        },
    ),
]


def test_a_hidden_model_reads_as_an_unknown_one():
    with pytest.raises(NotFound) as unknown:
        Router([]).route("text-only")  # a router with no deployments knows no model
    assert TRANSLATOR.error(cases.HIDDEN_DEPLOYMENT, "r") == TRANSLATOR.error(unknown.value, "r")


# the rows the shared tests (test_answers.py) run for this dialect
TABLES = cases.DialectTables(
    "openai",
    "openai.yaml",
    ("/chat/completions",),
    reads=READS,
    completions=COMPLETIONS,
    streams=STREAMS,
    errors=ERRORS,
    error_body=lambda error, words: error_body(error, *words),
    answers=ANSWERS,
)
