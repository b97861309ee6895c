"""The DJL LMI / SageMaker translator (gateway/dialects/lmi.py), table by table: the parameters
lmi.yaml defines (no tools, no stream_options), completions and chunks without `model` or
`refusal`, LMI's finish reasons (`eos_token`, `stop_sequence`, `length`), a first chunk that
carries the role and the first text together and a finish reason on the last token's line,
logprobs only with a positive `top_logprobs`, chunk logprobs wrapped in a list, `bytes` as code
points, no usage line, and errors as DJL Serving's `{code, type, message}`."""

from __future__ import annotations

from typing import Any

from gateway.core.canonical import (
    Choice,
    Finish,
    TextDelta,
    TokenLogprob,
    TopLogprob,
)
from gateway.core.errors import GatewayError
from tests.unit.dialects import cases
from tests.unit.dialects.cases import (
    LOGPROBS,
    MISSING_LOGPROB,
    USAGE,
    CompletionCase,
    ErrorCase,
    ReadCase,
    StreamCase,
)

# ----- read -------------------------------------------------------------------------------------

READS = [
    ReadCase("minimal body", {}, {}),
    ReadCase("model", {"model": "llama"}, {"model": "llama"}),
    ReadCase("stream", {"stream": True}, {"stream": True}),
    ReadCase("n", {"n": 2}, {"n": 2}),
    ReadCase("max_tokens", {"max_tokens": 5}, {"max_tokens": 5}),
    ReadCase("stop as a string", {"stop": "END"}, {"stop": ["END"]}),
    ReadCase(
        "sampling numbers",
        {"seed": 7, "temperature": 0.5, "top_p": 0.9, "frequency_penalty": 0.1, "presence_penalty": -0.1},
        {"seed": 7, "temperature": 0.5, "top_p": 0.9, "frequency_penalty": 0.1, "presence_penalty": -0.1},
    ),
    ReadCase("logit_bias", {"logit_bias": {"42": 1.5}}, {"logit_bias": {"42": 1.5}}),
    ReadCase(
        "logprobs and top_logprobs",
        {"logprobs": True, "top_logprobs": 2},
        {"logprobs": True, "top_logprobs": 2},
    ),
    ReadCase(
        "logprobs without a positive top_logprobs are not returned (the seed)",
        {"logprobs": True, "top_logprobs": 0},
        {},
    ),
    ReadCase("logprobs alone are not returned (the seed)", {"logprobs": True}, {}),
    ReadCase("user", {"user": "u-1"}, {"user": "u-1"}),
    ReadCase("ignore_eos is an option", {"ignore_eos": True}, {"options": {"ignore_eos": True}}),
    # lmi.yaml does not define these: extra parameters, kept as sent whatever their type
    ReadCase(
        "tools are extra, even not a list",
        {"tools": 1, "tool_choice": 3, "functions": "f"},
        {"extra": {"tools": 1, "tool_choice": 3, "functions": "f"}},
    ),
    ReadCase(
        "stream_options is extra, even not an object",
        {"stream": True, "stream_options": "x"},
        {"stream": True, "extra": {"stream_options": "x"}},
    ),
    ReadCase(
        "max_completion_tokens and response_format are extra",
        {"max_completion_tokens": 7, "response_format": {"type": "json_object"}},
        {"extra": {"max_completion_tokens": 7, "response_format": {"type": "json_object"}}},
    ),
]


# ----- completion -------------------------------------------------------------------------------


def message(content: str) -> dict[str, Any]:
    return {"role": "assistant", "content": content}


# LMI's `bytes` are code points: "é" is [233] (UTF-8 would be [195, 169]); an empty token's are null.
HE_LOGPROBS = {
    "content": [
        {
            "token": "Hé",
            "logprob": -0.25,
            "bytes": [72, 233],
            "top_logprobs": [
                {"token": "Hé", "logprob": -0.25, "bytes": [72, 233]},
                {"token": "Ho", "logprob": -1.5, "bytes": [72, 111]},
            ],
        },
        {"token": "!", "logprob": -0.5, "bytes": [33], "top_logprobs": []},
    ]
}
EMPTY_TOKEN = [TokenLogprob("", -2.0, [TopLogprob("", -2.0)])]

COMPLETIONS = [
    CompletionCase(
        "text: no model, no refusal",
        [Choice(0, "Hello", finish_reason="stop")],
        [{"index": 0, "message": message("Hello"), "logprobs": None, "finish_reason": "eos_token"}],
    ),
    CompletionCase(
        "logprobs: bytes as code points, no refusal",
        [Choice(0, "Hé!", logprobs=LOGPROBS, finish_reason="length")],
        [{"index": 0, "message": message("Hé!"), "logprobs": HE_LOGPROBS, "finish_reason": "length"}],
    ),
    CompletionCase(
        "an empty token's bytes are null",
        [Choice(0, "", logprobs=EMPTY_TOKEN, finish_reason="stop")],
        [
            {
                "index": 0,
                "message": message(""),
                "logprobs": {
                    "content": [
                        {
                            "token": "",
                            "logprob": -2.0,
                            "bytes": None,
                            "top_logprobs": [{"token": "", "logprob": -2.0, "bytes": None}],
                        }
                    ]
                },
                "finish_reason": "eos_token",
            }
        ],
    ),
    CompletionCase(
        "a logprob the backend could not give is -9999.0 (lmi.yaml's logprob is a number)",
        [Choice(0, "?", logprobs=MISSING_LOGPROB, finish_reason="stop")],
        [
            {
                "index": 0,
                "message": message("?"),
                "logprobs": {"content": cases.MISSING_LOGPROB_CONTENT},
                "finish_reason": "eos_token",
            }
        ],
    ),
    CompletionCase(
        "bytes are the token's code points whatever the backend gave, null where it said null",
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
                        {"token": "é", "logprob": -0.2, "bytes": [233], "top_logprobs": []},
                    ]
                },
                "finish_reason": "eos_token",
            }
        ],
    ),
    CompletionCase(
        "the fingerprint, tier and refusal have no field: a refusal is content",
        [Choice(0, "", refusal=cases.REFUSAL, finish_reason="stop")],
        [{"index": 0, "message": message(cases.REFUSAL), "logprobs": None, "finish_reason": "eos_token"}],
    ),
    CompletionCase(
        "two choices",
        [Choice(0, "a", finish_reason="stop_sequence"), Choice(1, "b", finish_reason="length")],
        [
            {"index": 0, "message": message("a"), "logprobs": None, "finish_reason": "stop_sequence"},
            {"index": 1, "message": message("b"), "logprobs": None, "finish_reason": "length"},
        ],
    ),
]


# ----- chunks -----------------------------------------------------------------------------------


def chunk(
    delta: dict[str, Any], finish_reason: str | None = None, logprobs: Any = None, index: int = 0
) -> dict[str, Any]:
    return {
        "id": cases.ANSWER_ID,
        "object": "chat.completion.chunk",
        "created": cases.CREATED,
        "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}],
    }


STREAMS = [
    StreamCase(
        "the first line carries the role and the first text; the last token's line the finish",
        [TextDelta(0, "Hel"), TextDelta(0, "lo", last=True), Finish(0, "stop")],
        [chunk({"role": "assistant", "content": "Hel"}), chunk({"content": "lo"}, "eos_token")],
    ),
    StreamCase(
        "a backend that cannot tell the last text: the finish on a line of its own",
        [TextDelta(0, "Hel"), TextDelta(0, "lo"), Finish(0, "stop")],
        [
            chunk({"role": "assistant", "content": "Hel"}),
            chunk({"content": "lo"}),
            chunk({"content": ""}, "eos_token"),
        ],
    ),
    StreamCase(
        "each choice's first line carries its role",
        [TextDelta(0, "a"), TextDelta(1, "b", last=True), Finish(1, "length"), TextDelta(0, "c")],
        [
            chunk({"role": "assistant", "content": "a"}),
            chunk({"role": "assistant", "content": "b"}, "length", index=1),
            chunk({"content": "c"}),
        ],
    ),
    StreamCase(
        "logprobs wrapped in a list, bytes as code points",
        [TextDelta(0, "Hé!", LOGPROBS, last=True), Finish(0, "length")],
        [chunk({"role": "assistant", "content": "Hé!"}, "length", logprobs=[HE_LOGPROBS])],
    ),
    StreamCase(
        "a finish before any text",
        [Finish(0, "length")],
        [chunk({"role": "assistant", "content": ""}, "length")],
    ),
    StreamCase(
        "what the backend said of the answer has no field in LMI",
        [cases.SERVED, TextDelta(0, "Hi", last=True), Finish(0, "stop")],
        [chunk({"role": "assistant", "content": "Hi"}, "eos_token")],
    ),
    # an LMI request cannot ask for usage (stream_options is extra): never a usage line
    StreamCase(
        "usage: no line, even asked for",
        [TextDelta(0, "Hi", last=True), Finish(0, "stop"), USAGE],
        [chunk({"role": "assistant", "content": "Hi"}, "eos_token")],
        include_usage=True,
    ),
    StreamCase(
        "a line marked last that no finish follows is sent with the next event",
        [TextDelta(0, "Hi", last=True), USAGE],
        [chunk({"role": "assistant", "content": "Hi"})],
    ),
]


# ----- error ------------------------------------------------------------------------------------


def error_body(error: GatewayError, exception: str) -> dict[str, Any]:
    return {"code": error.status, "type": exception, "message": error.message}


# the errors only this dialect answers its own way; those every dialect answers with the same
# status (its words for them in SHARED_ERRORS) are in test_answers.py
ERRORS = [
    ErrorCase(
        "hidden deployment is 403",
        cases.HIDDEN_DEPLOYMENT,
        403,
        {
            "code": 403,
            "type": "ForbiddenException",
            "message": "This key may not use the deployment 'text-only'.",
        },
    ),
]


# the rows the shared tests (test_answers.py) run for this dialect
TABLES = cases.DialectTables(
    "lmi",
    "lmi.yaml",
    ("/v1/chat/completions", "/invocations"),
    reads=READS,
    completions=COMPLETIONS,
    streams=STREAMS,
    errors=ERRORS,
    error_body=error_body,
    completion_without=("model",),
)
