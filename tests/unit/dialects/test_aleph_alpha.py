"""The Aleph Alpha translator (gateway/dialects/aleph_alpha.py), table by table: the parameters
aleph_alpha.yaml defines (the seed's and the 4.7.0 document's), those it marks
`x-chatgate-unsupported` (ignored ones dropped, parallel_tool_calls refused with 400, as the
document says), the strict message order (400; tool results take the user's turn), completions with
-9999.0 for a logprob the backend could not give and no `refusal` in logprobs, chunks with
`usage` and `system_fingerprint` null where the seed says so, finish chunks with `content: ""`,
and errors as
`{"error": message, "code": UPPER_SNAKE}`."""

from __future__ import annotations

from typing import Any

from gateway.core.canonical import (
    Choice,
    Finish,
    RefusalDelta,
    ServedBy,
    TextDelta,
)
from gateway.core.errors import BadRequest, GatewayError
from tests.unit.dialects import cases
from tests.unit.dialects.cases import (
    LOGPROBS,
    MISSING_LOGPROB,
    USAGE,
    USAGE_BODY,
    AnswerCase,
    CompletionCase,
    ErrorCase,
    ReadCase,
    RefusedCase,
    StreamCase,
)

WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
WEATHER_CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
JSON_SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "answer", "schema": {"type": "object"}}}
IMAGE_PART = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}


def conversation(*roles: str) -> list[dict[str, str]]:
    return [{"role": role, "content": "x"} for role in roles]


# ----- read -------------------------------------------------------------------------------------

READS = [
    ReadCase("minimal body", {}, {}),
    ReadCase("model", {"model": "llama-3.1-8b-instruct"}, {"model": "llama-3.1-8b-instruct"}),
    ReadCase(
        "stream with usage",
        {"stream": True, "stream_options": {"include_usage": True}},
        {"stream": True, "include_usage": True},
    ),
    ReadCase("n", {"n": 2}, {"n": 2}),
    ReadCase("max_tokens", {"max_tokens": 5}, {"max_tokens": 5}),
    ReadCase("maximum_tokens, the official client's name", {"maximum_tokens": 6}, {"max_tokens": 6}),
    ReadCase("stop as a string", {"stop": "END"}, {"stop": ["END"]}),
    ReadCase(
        "sampling numbers",
        {"temperature": 0.5, "top_p": 0.9, "frequency_penalty": 0.1, "presence_penalty": -0.1},
        {"temperature": 0.5, "top_p": 0.9, "frequency_penalty": 0.1, "presence_penalty": -0.1},
    ),
    ReadCase("logit_bias", {"logit_bias": {"42": 1.5}}, {"logit_bias": {"42": 1.5}}),
    ReadCase(
        "logprobs and top_logprobs",
        {"logprobs": True, "top_logprobs": 3},
        {"logprobs": True, "top_logprobs": 3},
    ),
    ReadCase(
        "a system message, then user and assistant alternating, ending with user",
        {"messages": conversation("system", "user", "assistant", "user")},
        {"messages": conversation("system", "user", "assistant", "user")},
    ),
    ReadCase(
        "ignored parameters are dropped",
        {"seed": 7, "service_tier": "auto", "user": "u-1"},
        {},
    ),
    ReadCase(
        "tools and tool_choice (the 4.7.0 document)",
        {"tools": [WEATHER_TOOL], "tool_choice": "required"},
        {"tools": [WEATHER_TOOL], "tool_choice": "required"},
    ),
    ReadCase(
        "response_format with a JSON schema (the 4.7.0 document)",
        {"response_format": JSON_SCHEMA_FORMAT},
        {"response_format": JSON_SCHEMA_FORMAT},
    ),
    ReadCase(
        "steering_concepts and the client's top_k are options",
        {"steering_concepts": ["concept-1"], "top_k": 5},
        {"options": {"steering_concepts": ["concept-1"], "top_k": 5}},
    ),
    ReadCase(
        "image parts, and a tool result taking the user's turn",
        {
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "x"}, IMAGE_PART]},
                {"role": "assistant", "content": "", "tool_calls": [WEATHER_CALL]},
                {"role": "tool", "content": "18 degrees", "tool_call_id": "call_1"},
            ]
        },
        {
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "x"}, IMAGE_PART]},
                {"role": "assistant", "content": "", "tool_calls": [WEATHER_CALL]},
                {"role": "tool", "content": "18 degrees", "tool_call_id": "call_1"},
            ]
        },
    ),
    ReadCase(
        "tools, tool_choice and response_format sent as null read as unset",
        {"tools": None, "tool_choice": None, "response_format": None},
        {},
    ),
    ReadCase(
        "ignored or rejected options sent as null read as unset",
        {"service_tier": None, "parallel_tool_calls": None},
        {},
    ),
    # aleph_alpha.yaml does not define these: extra parameters, kept as sent whatever their type
    ReadCase(
        "functions is extra, even not a list",
        {"functions": 1, "function_call": 2},
        {"extra": {"functions": 1, "function_call": 2}},
    ),
    ReadCase(
        "max_completion_tokens is extra",
        {"max_completion_tokens": 7},
        {"extra": {"max_completion_tokens": 7}},
    ),
]


def out_of_order(roles: list[str], index: int | None) -> RefusedCase:
    """Roles whose message `index` breaks the order (None: the conversation does not end with user)."""
    loc: list[str | int] = ["body", "messages"] if index is None else ["body", "messages", index, "role"]
    value = None if index is None else roles[index]
    return RefusedCase(
        f"message order: {' '.join(roles)}",
        {"messages": conversation(*roles)},
        BadRequest,
        "BadRequest",
        "messages",
        loc,
        value,
    )


REFUSED = [
    cases.rejected("parallel_tool_calls", False),
    RefusedCase(
        "max_tokens and maximum_tokens together",
        {"max_tokens": 5, "maximum_tokens": 6},
        BadRequest,
        "BadRequest",
        "maximum_tokens",
        ["body", "maximum_tokens"],
        6,
    ),
    out_of_order(["assistant"], 0),
    out_of_order(["system", "system", "user"], 1),
    out_of_order(["user", "user"], 1),
    out_of_order(["user", "system", "user"], 1),
    out_of_order(["user", "assistant"], None),
    out_of_order(["system"], None),
]


# ----- completion -------------------------------------------------------------------------------


def message(content: str) -> dict[str, Any]:
    return {"role": "assistant", "content": content}


END_BYTES = list(b"<|end|>")
END_TOKEN = {
    "token": "<|end|>",
    "logprob": -0.1,
    "bytes": END_BYTES,
    "top_logprobs": [{"token": "<|end|>", "logprob": -0.1, "bytes": END_BYTES}],
}


COMPLETIONS = [
    CompletionCase(
        "text, no refusal",
        [Choice(0, "Hello", finish_reason="stop")],
        [{"index": 0, "message": message("Hello"), "logprobs": None, "finish_reason": "stop"}],
    ),
    CompletionCase(
        "logprobs",
        [Choice(0, "Hé!", logprobs=LOGPROBS, finish_reason="length")],
        [
            {
                "index": 0,
                "message": message("Hé!"),
                "logprobs": {
                    "content": cases.LOGPROBS_CONTENT,
                },
                "finish_reason": "length",
            }
        ],
    ),
    CompletionCase(
        "a logprob the backend could not give is -9999.0",
        [Choice(0, "?", logprobs=MISSING_LOGPROB, finish_reason="stop")],
        [
            {
                "index": 0,
                "message": message("?"),
                "logprobs": {
                    "content": cases.MISSING_LOGPROB_CONTENT,
                },
                "finish_reason": "stop",
            }
        ],
    ),
    CompletionCase(
        "bytes the backend said were null are the token's UTF-8 (the seed has no null)",
        [Choice(0, "x", logprobs=cases.NO_BYTES, finish_reason="stop")],
        [
            {
                "index": 0,
                "message": message("x"),
                "logprobs": {"content": [END_TOKEN]},
                "finish_reason": "stop",
            }
        ],
    ),
    CompletionCase(
        "a refusal is the model's words: content (aleph_alpha.yaml has no refusal field)",
        [Choice(0, "", refusal=cases.REFUSAL, finish_reason="stop")],
        [{"index": 0, "message": message(cases.REFUSAL), "logprobs": None, "finish_reason": "stop"}],
    ),
    CompletionCase(
        "two choices",
        [Choice(0, "a", finish_reason="content_filter"), Choice(1, "b", finish_reason="stop")],
        [
            {"index": 0, "message": message("a"), "logprobs": None, "finish_reason": "content_filter"},
            {"index": 1, "message": message("b"), "logprobs": None, "finish_reason": "stop"},
        ],
    ),
]


ANSWERS = [
    AnswerCase("nothing said", ServedBy(), USAGE, {"usage": USAGE_BODY}),
    AnswerCase(
        "the fingerprint; no tier nor usage details (the seed has neither)",
        cases.SERVED,
        cases.DETAILED_USAGE,
        {"system_fingerprint": "fp_44709d6fcb", "usage": USAGE_BODY},
    ),
]


# ----- chunks -----------------------------------------------------------------------------------


def chunk(choice: dict[str, Any] | None = None, **more: Any) -> dict[str, Any]:
    """The seed: `system_fingerprint` null but in a choice's last chunk, `usage` null but in the
    usage chunk."""
    return {
        "id": cases.ANSWER_ID,
        "object": "chat.completion.chunk",
        "created": cases.CREATED,
        "model": cases.MODEL,
        "choices": [] if choice is None else [choice],
        "system_fingerprint": None,
        "usage": None,
        **more,
    }


def choice(delta: dict[str, Any], finish_reason: str | None = None, logprobs: Any = None) -> dict[str, Any]:
    return {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}


STREAMS = [
    StreamCase(
        "text, a finish with empty content, usage",
        [TextDelta(0, "Hel"), TextDelta(0, "lo"), Finish(0, "stop"), USAGE],
        [
            chunk(choice({"role": "assistant", "content": ""})),
            chunk(choice({"content": "Hel"})),
            chunk(choice({"content": "lo"})),
            chunk(choice({"content": ""}, "stop")),
            chunk(usage=USAGE_BODY),
        ],
        include_usage=True,
    ),
    StreamCase("usage not asked for: no chunk", [USAGE], []),
    StreamCase(
        "the fingerprint in each choice's last chunk only",
        [cases.SERVED, TextDelta(0, "Hi"), Finish(0, "stop"), TextDelta(1, "Yo"), Finish(1, "length"), USAGE],
        [
            chunk(choice({"role": "assistant", "content": ""})),
            chunk(choice({"content": "Hi"})),
            chunk(choice({"content": ""}, "stop"), system_fingerprint="fp_44709d6fcb"),
            chunk({**choice({"role": "assistant", "content": ""}), "index": 1}),
            chunk({**choice({"content": "Yo"}), "index": 1}),
            chunk({**choice({"content": ""}, "length"), "index": 1}, system_fingerprint="fp_44709d6fcb"),
            chunk(usage=USAGE_BODY),
        ],
        include_usage=True,
    ),
    StreamCase(
        "a refusal streams as content",
        [RefusalDelta(0, cases.REFUSAL)],
        [chunk(choice({"role": "assistant", "content": ""})), chunk(choice({"content": cases.REFUSAL}))],
    ),
    StreamCase(
        "a finish before any text",
        [Finish(0, "length")],
        [chunk(choice({"role": "assistant", "content": ""}, "length"))],
    ),
    StreamCase(
        "a missing logprob is -9999.0 in a chunk too",
        [TextDelta(0, "?", MISSING_LOGPROB)],
        [
            chunk(choice({"role": "assistant", "content": ""})),
            chunk(
                choice(
                    {"content": "?"},
                    logprobs={
                        "content": cases.MISSING_LOGPROB_CONTENT,
                    },
                )
            ),
        ],
    ),
]


# ----- error ------------------------------------------------------------------------------------


def error_body(error: GatewayError, code: str) -> dict[str, Any]:
    return {"error": error.message, "code": code}


# the errors only this dialect answers its own way; those every dialect answers with the same
# status (its words for them in SHARED_ERRORS) are in test_answers.py
ERRORS = [
    ErrorCase(
        "hidden deployment is 403",
        cases.HIDDEN_DEPLOYMENT,
        403,
        {"error": "This key may not use the deployment 'text-only'.", "code": "DEPLOYMENT_NOT_ALLOWED"},
    ),
]


# the rows the shared tests (test_answers.py) run for this dialect
TABLES = cases.DialectTables(
    "aleph_alpha",
    "aleph_alpha.yaml",
    ("/chat/completions",),
    reads=READS,
    completions=COMPLETIONS,
    streams=STREAMS,
    errors=ERRORS,
    error_body=error_body,
    refused=REFUSED,
    answers=ANSWERS,
)
