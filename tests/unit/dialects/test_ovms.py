"""The OpenVINO Model Server translator (gateway/dialects/ovms.py), table by table: OpenAI's
parameters plus OVMS's own sampling options, null read as "not set", the parameters ovms.yaml marks
rejected (400, as ovms.yaml says), the rules between fields of its `x-chatgate-rules` (400, one
table for every dialect in test_rules.py), answers without `id` and logprobs without `refusal`
(OVMS has neither), `usage: null` before the usage chunk, only `stop` and `length` as finish
reasons, and errors as `{"error": message}`."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.core.canonical import Choice, Finish, RefusalDelta, TextDelta
from gateway.core.errors import BadRequest
from tests.unit.dialects import cases
from tests.unit.dialects.cases import (
    LOGPROBS,
    MINIMAL_BODY,
    MISSING_LOGPROB,
    USAGE,
    USAGE_BODY,
    WEATHER_CALL,
    WEATHER_CALL_BODY,
    CompletionCase,
    ErrorCase,
    ReadCase,
    RefusedCase,
    StreamCase,
)

TRANSLATOR = cases.translator("ovms")
WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather"}}

# ----- read -------------------------------------------------------------------------------------

READS = [
    ReadCase("minimal body", {}, {}),
    ReadCase("model", {"model": "llama"}, {"model": "llama"}),
    ReadCase(
        "stream with usage",
        {"stream": True, "stream_options": {"include_usage": True}},
        {"stream": True, "include_usage": True},
    ),
    ReadCase("stop as a string", {"stop": "END"}, {"stop": ["END"]}),
    ReadCase("max_tokens", {"max_tokens": 5}, {"max_tokens": 5}),
    ReadCase("max_completion_tokens", {"max_completion_tokens": 7}, {"max_tokens": 7}),
    ReadCase(
        "max_completion_tokens wins over max_tokens",
        {"max_tokens": 5, "max_completion_tokens": 7},
        {"max_tokens": 7},
    ),
    ReadCase(
        "sampling numbers",
        {"seed": 7, "temperature": 0.5, "top_p": 0.9, "frequency_penalty": 0.1, "presence_penalty": -0.1},
        {"seed": 7, "temperature": 0.5, "top_p": 0.9, "frequency_penalty": 0.1, "presence_penalty": -0.1},
    ),
    ReadCase(
        "tools and tool_choice",
        {"tools": [WEATHER_TOOL], "tool_choice": "auto"},
        {"tools": [WEATHER_TOOL], "tool_choice": "auto"},
    ),
    ReadCase("logprobs", {"logprobs": True}, {"logprobs": True}),
    ReadCase("n with best_of above it", {"n": 2, "best_of": 3}, {"n": 2, "options": {"best_of": 3}}),
    ReadCase("best_of equal to n", {"n": 2, "best_of": 2}, {"n": 2, "options": {"best_of": 2}}),
    ReadCase(
        "OVMS sampling options",
        {"top_k": 40, "repetition_penalty": 1.1, "length_penalty": 0.8, "ignore_eos": True},
        {"options": {"top_k": 40, "repetition_penalty": 1.1, "length_penalty": 0.8, "ignore_eos": True}},
    ),
    ReadCase(
        "speculative and prompt lookup decoding options",
        {"num_assistant_tokens": 5, "max_ngram_size": 3},
        {"options": {"num_assistant_tokens": 5, "max_ngram_size": 3}},
    ),
    ReadCase(
        "speculative decoding by confidence",
        {"assistant_confidence_threshold": 0.4},
        {"options": {"assistant_confidence_threshold": 0.4}},
    ),
    ReadCase(
        "a streamed stop string is kept by default",
        {"stream": True, "stop": ["END"]},
        {"stream": True, "stop": ["END"], "options": {"include_stop_str_in_output": True}},
    ),
    ReadCase("not streamed, no default", {"stop": ["END"]}, {"stop": ["END"]}),
    ReadCase(
        "n within best_of",
        {"n": 1, "best_of": 1},
        {"options": {"best_of": 1}, "defaulted": frozenset({"n", "best_of"})},
    ),
    ReadCase(
        "include_stop_str_in_output false without stream",
        {"include_stop_str_in_output": False},
        {"options": {"include_stop_str_in_output": False}},
    ),
    ReadCase(
        "include_stop_str_in_output true with stream",
        {"stream": True, "include_stop_str_in_output": True},
        {"stream": True, "options": {"include_stop_str_in_output": True}},
    ),
    ReadCase(
        "null is not set",
        {
            "stream": None,
            "stream_options": None,
            "stop": None,
            "n": None,
            "max_tokens": 5,
            "max_completion_tokens": None,
            "logprobs": None,
            "seed": None,
            "tools": None,
        },
        {"max_tokens": 5},
    ),
    ReadCase(
        "an option sent as null is not set",
        {"top_k": None, "best_of": None, "use_beam_search": None},
        {},
    ),
    ReadCase(
        "a parameter ovms.yaml does not define is extra",
        {"parallel_tool_calls": "no", "mood": 1},
        {"extra": {"parallel_tool_calls": "no", "mood": 1}},
    ),
]


REFUSED = [
    # OpenAI's parameters the seed calls unsupported
    cases.rejected("logit_bias", {"50256": -100}),
    cases.rejected("top_logprobs", 2),
    cases.rejected("response_format", {"type": "json_object"}),
    cases.rejected("user", "u-1"),
    cases.rejected("functions", [{"name": "get_weather"}]),
    cases.rejected("function_call", "auto"),
    # vLLM's
    cases.rejected("min_p", 0.1),
    cases.rejected("use_beam_search", True),
    cases.rejected("early_stopping", True),
    cases.rejected("stop_token_ids", [2]),
    cases.rejected("min_tokens", 3),
    cases.rejected("prompt_logprobs", 1),
    cases.rejected("detokenize", False),
    cases.rejected("skip_special_tokens", False),
    cases.rejected("spaces_between_special_tokens", False),
    cases.rejected("logits_processors", ["x"]),
    cases.rejected("truncate_prompt_tokens", 10),
    # OVMS's rules (ovms.yaml `x-chatgate-rules`)
    RefusedCase(
        "include_stop_str_in_output false with stream",
        {"stream": True, "include_stop_str_in_output": False},
        BadRequest,
        "BadRequest",
        "include_stop_str_in_output",
        ["body", "include_stop_str_in_output"],
        False,
    ),
    RefusedCase("best_of below n", {"n": 3, "best_of": 2}, BadRequest, "BadRequest", "n", ["body", "n"], 3),
    RefusedCase("n above the default best_of", {"n": 2}, BadRequest, "BadRequest", "n", ["body", "n"], 2),
    RefusedCase(
        "n above 1 streamed", {"n": 2, "stream": True}, BadRequest, "BadRequest", "n", ["body", "n"], 2
    ),
    RefusedCase(
        "best_of streamed",
        {"best_of": 2, "stream": True},
        BadRequest,
        "BadRequest",
        "best_of",
        ["body", "best_of"],
        2,
    ),
    RefusedCase(
        "logprobs streamed",
        {"logprobs": True, "stream": True},
        BadRequest,
        "BadRequest",
        "logprobs",
        ["body", "logprobs"],
        True,
    ),
    RefusedCase(
        "stream_options without stream",
        {"stream_options": {"include_usage": True}},
        BadRequest,
        "BadRequest",
        "stream_options",
        ["body", "stream_options"],
        {"include_usage": True},
    ),
    RefusedCase(
        "both speculative knobs",
        {"num_assistant_tokens": 5, "assistant_confidence_threshold": 0.4},
        BadRequest,
        "BadRequest",
        "assistant_confidence_threshold",
        ["body", "assistant_confidence_threshold"],
        0.4,
    ),
]


def test_best_of_below_n_says_both():
    with pytest.raises(BadRequest) as raised:
        TRANSLATOR.read({**MINIMAL_BODY, "n": 3, "best_of": 2})
    assert TRANSLATOR.error(raised.value, "request-1").body == {
        "error": "n value (3) cannot be greater than best_of (2); best_of defaults to 1, so n above 1 "
        "needs best_of at least n, which cannot stream."
    }


# ----- completion -------------------------------------------------------------------------------


def message(content: str | None, **more: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": content, **more}


COMPLETIONS = [
    CompletionCase(
        "text, no refusal",
        [Choice(0, "Hello", finish_reason="stop")],
        [{"index": 0, "message": message("Hello"), "logprobs": None, "finish_reason": "stop"}],
    ),
    CompletionCase(
        "a tool call ends with stop",
        [Choice(0, "", tool_calls=[WEATHER_CALL], finish_reason="tool_calls")],
        [
            {
                "index": 0,
                "message": message(None, tool_calls=[WEATHER_CALL_BODY]),
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
    ),
    CompletionCase(
        "logprobs, a missing one null",
        [Choice(0, "Hé!?", logprobs=LOGPROBS + MISSING_LOGPROB, finish_reason="length")],
        [
            {
                "index": 0,
                "message": message("Hé!?"),
                "logprobs": {
                    "content": [
                        *cases.LOGPROBS_CONTENT,
                        {"token": "?", "logprob": None, "bytes": [63], "top_logprobs": []},
                    ],
                },
                "finish_reason": "length",
            }
        ],
    ),
    CompletionCase(
        "two choices",
        [Choice(0, "a", finish_reason="stop_sequence"), Choice(1, "b", finish_reason="length")],
        [
            {"index": 0, "message": message("a"), "logprobs": None, "finish_reason": "stop"},
            {"index": 1, "message": message("b"), "logprobs": None, "finish_reason": "length"},
        ],
    ),
]


# ----- chunks -----------------------------------------------------------------------------------


def chunk(choice: dict[str, Any] | None = None, **more: Any) -> dict[str, Any]:
    return {
        "object": "chat.completion.chunk",
        "created": cases.CREATED,
        "model": cases.MODEL,
        "choices": [] if choice is None else [choice],
        **more,
    }


def choice(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}


STREAMS = [
    StreamCase(
        "text, finish and usage",
        [TextDelta(0, "Hel"), TextDelta(0, "lo"), Finish(0, "stop_sequence"), USAGE],
        [
            chunk(choice({"role": "assistant", "content": ""}), usage=None),
            chunk(choice({"content": "Hel"}), usage=None),
            chunk(choice({"content": "lo"}), usage=None),
            chunk(choice({}, "stop"), usage=None),
            chunk(usage=USAGE_BODY),
        ],
        include_usage=True,
    ),
    StreamCase(
        "no fingerprint, no usage details (OVMS has neither); a refusal is content",
        [cases.SERVED, RefusalDelta(0, cases.REFUSAL), Finish(0, "stop"), cases.DETAILED_USAGE],
        [
            chunk(choice({"role": "assistant", "content": ""}), usage=None),
            chunk(choice({"content": cases.REFUSAL}), usage=None),
            chunk(choice({}, "stop"), usage=None),
            chunk(usage=USAGE_BODY),
        ],
        include_usage=True,
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
            chunk(choice({}, "stop")),
        ],
    ),
]


# ----- error ------------------------------------------------------------------------------------

# the errors only this dialect answers its own way; those every dialect answers with the same
# status (its words for them in SHARED_ERRORS) are in test_answers.py
ERRORS = [
    ErrorCase(
        "hidden deployment is 403",
        cases.HIDDEN_DEPLOYMENT,
        403,
        {"error": "This key may not use the deployment 'text-only'."},
    ),
]


# the rows the shared tests (test_answers.py) run for this dialect
TABLES = cases.DialectTables(
    "ovms",
    "ovms.yaml",
    ("/chat/completions",),
    reads=READS,
    completions=COMPLETIONS,
    streams=STREAMS,
    errors=ERRORS,
    error_body=lambda error, words: {"error": error.message},
    refused=REFUSED,
    completion_without=("id",),
)
