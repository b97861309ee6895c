"""The Azure AI Model Inference translator (gateway/dialects/azure.py), table by table: the few
parameters azure.yaml defines (everything else, `n` too, is extra), OpenAI's
completion and stream shapes without `refusal` or a choice's `logprobs` (neither is in
azure.yaml), `usage` in a stream's last chunk, and the seed's flat error bodies with the code in
`x-ms-error-code` (and not in the body for 401, 404 and 429)."""

from __future__ import annotations

from typing import Any

from gateway.core.canonical import (
    Choice,
    Finish,
    RefusalDelta,
    ServedBy,
    TextDelta,
)
from gateway.core.errors import GatewayError, UnprocessableContent
from tests.unit.dialects import cases
from tests.unit.dialects.cases import (
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

WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather"}}

# ----- read -------------------------------------------------------------------------------------

USER = [{"role": "user", "content": "Hi"}]
SEED_PARTS = [
    {"type": "text", "content": "What is this?"},
    {"type": "image", "content": "data:image/png;base64,iVBORw0KGgo=", "detail": "low"},
    {"type": "image_url", "content": "https://example.com/cat.png"},
]
READ_PARTS = [
    {"type": "text", "text": "What is this?"},
    {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo=", "detail": "low"}},
    {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
]

READS = [
    ReadCase("minimal body", {}, {}),
    ReadCase("model", {"model": "phi-3"}, {"model": "phi-3"}),
    ReadCase("stream", {"stream": True}, {"stream": True}),
    ReadCase("max_tokens", {"max_tokens": 5}, {"max_tokens": 5}),
    ReadCase("stop", {"stop": ["END"]}, {"stop": ["END"]}),
    ReadCase(
        "sampling numbers",
        {"seed": 7, "temperature": 0.5, "top_p": 0.9, "frequency_penalty": 0.1, "presence_penalty": -0.1},
        {"seed": 7, "temperature": 0.5, "top_p": 0.9, "frequency_penalty": 0.1, "presence_penalty": -0.1},
    ),
    ReadCase(
        "response_format",
        {"response_format": {"type": "json_object"}},
        {"response_format": {"type": "json_object"}},
    ),
    ReadCase(
        "tools and tool_choice",
        {"tools": [WEATHER_TOOL], "tool_choice": "auto"},
        {"tools": [WEATHER_TOOL], "tool_choice": "auto"},
    ),
    # azure.yaml does not define these: they are extra parameters, kept as sent whatever their
    # type, for the extra-parameters policy to pass, drop or refuse.
    ReadCase("n is extra, even not a number", {"n": "x"}, {"extra": {"n": "x"}}),
    ReadCase(
        "stream_options (LiteLLM's azure_ai sends it): include_usage read",
        {"stream": True, "stream_options": {"include_usage": True}},
        {"stream": True, "include_usage": True},
    ),
    ReadCase(
        "max_completion_tokens is extra: max_tokens stays unset",
        {"max_completion_tokens": 7},
        {"extra": {"max_completion_tokens": 7}},
    ),
    ReadCase(
        "OpenAI's other parameters are extra",
        {"logprobs": "yes", "functions": 1, "user": ["u"], "logit_bias": None},
        {"extra": {"logprobs": "yes", "functions": 1, "user": ["u"], "logit_bias": None}},
    ),
    ReadCase("a model's own parameter is extra", {"safe_mode": True}, {"extra": {"safe_mode": True}}),
    # the seed's message shapes, read as the refspec's (and OpenAI's), which every backend reads
    ReadCase(
        "the seed's parts: text content, image and image_url content with detail",
        {"messages": [{"role": "user", "content": SEED_PARTS}]},
        {"messages": [{"role": "user", "content": READ_PARTS}]},
    ),
    ReadCase(
        "the seed's parts on any role, mixed with the refspec's",
        {"messages": [{"role": "system", "content": [SEED_PARTS[0], READ_PARTS[0]]}, *USER]},
        {"messages": [{"role": "system", "content": [READ_PARTS[0], READ_PARTS[0]]}, *USER]},
    ),
    ReadCase(
        "the seed's tool message: no tool_call_id, kept as it is",
        {"messages": [*USER, {"role": "tool", "content": "22 degrees"}]},
        {"messages": [*USER, {"role": "tool", "content": "22 degrees"}]},
    ),
]


# ----- completion -------------------------------------------------------------------------------


COMPLETIONS = [
    CompletionCase(
        "text, no refusal",
        [Choice(0, "Hello", finish_reason="stop")],
        [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello"},
                "finish_reason": "stop",
            }
        ],
    ),
    CompletionCase(
        "a tool call, content null",
        [Choice(0, "", tool_calls=[WEATHER_CALL], finish_reason="tool_calls")],
        [
            {
                "index": 0,
                "message": {"role": "assistant", "content": None, "tool_calls": [WEATHER_CALL_BODY]},
                "finish_reason": "tool_calls",
            }
        ],
    ),
    CompletionCase(
        "a refusal is the model's words: content (azure.yaml has no refusal field)",
        [Choice(0, "", refusal=cases.REFUSAL, finish_reason="stop")],
        [{"index": 0, "message": {"role": "assistant", "content": cases.REFUSAL}, "finish_reason": "stop"}],
    ),
    CompletionCase(
        "filtered",
        [Choice(0, "Hel", finish_reason="content_filter")],
        [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hel"},
                "finish_reason": "content_filter",
            }
        ],
    ),
]


ANSWERS = [
    AnswerCase("nothing said", ServedBy(), USAGE, {"usage": USAGE_BODY}),
    AnswerCase(
        "the fingerprint; no tier nor usage details (azure.yaml has neither)",
        cases.SERVED,
        cases.DETAILED_USAGE,
        {"system_fingerprint": "fp_44709d6fcb", "usage": USAGE_BODY},
    ),
]


# ----- chunks -----------------------------------------------------------------------------------


def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    return {
        "id": cases.ANSWER_ID,
        "object": "chat.completion.chunk",
        "created": cases.CREATED,
        "model": cases.MODEL,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    }


FINGERPRINT = {"system_fingerprint": "fp_44709d6fcb"}


def usage_chunk() -> dict[str, Any]:
    return {**chunk({}), "choices": [], "usage": USAGE_BODY}


STREAMS = [
    StreamCase(
        "text opens with a role chunk; the finish chunk's delta is empty",
        [TextDelta(0, "Hel"), TextDelta(0, "lo"), Finish(0, "length"), USAGE],
        [
            chunk({"role": "assistant", "content": ""}),
            chunk({"content": "Hel"}),
            chunk({"content": "lo"}),
            {**chunk({}, "length"), "usage": USAGE_BODY},
        ],
    ),
    StreamCase(
        "a tool call",
        [WEATHER_CALL, Finish(0, "tool_calls"), USAGE],
        [
            chunk({"role": "assistant", "content": None, "tool_calls": [{"index": 0, **WEATHER_CALL_BODY}]}),
            {**chunk({}, "tool_calls"), "usage": USAGE_BODY},
        ],
    ),
    # azure.yaml: `usage` in the last chunk, always (an Azure request has no stream_options), on
    # the finish chunk (the refspec's chunk has at least one choice)
    StreamCase(
        "usage on the last chunk, the finish, always",
        [TextDelta(0, "Hi"), Finish(0, "stop"), USAGE],
        [
            chunk({"role": "assistant", "content": ""}),
            chunk({"content": "Hi"}),
            {**chunk({}, "stop"), "usage": USAGE_BODY},
        ],
    ),
    StreamCase(
        "usage without a finish before it: a chunk of its own",
        [TextDelta(0, "Hi"), USAGE],
        [chunk({"role": "assistant", "content": ""}), chunk({"content": "Hi"}), usage_chunk()],
    ),
    StreamCase(
        "the fingerprint in every chunk once the backend said it (no tier: azure.yaml has none)",
        [cases.SERVED, TextDelta(0, "Hi"), Finish(0, "stop"), USAGE],
        [
            {**chunk({"role": "assistant", "content": ""}), **FINGERPRINT},
            {**chunk({"content": "Hi"}), **FINGERPRINT},
            {**chunk({}, "stop"), **FINGERPRINT, "usage": USAGE_BODY},
        ],
    ),
    StreamCase(
        "a refusal is the model's words: content (azure.yaml has no refusal field)",
        [RefusalDelta(0, cases.REFUSAL), Finish(0, "stop"), USAGE],
        [
            chunk({"role": "assistant", "content": ""}),
            chunk({"content": cases.REFUSAL}),
            {**chunk({}, "stop"), "usage": USAGE_BODY},
        ],
    ),
]


# ----- error ------------------------------------------------------------------------------------


def error_body(error: GatewayError, described: str, **more: Any) -> dict[str, Any]:
    """The seed's fields; `error` Azure.Core's object, which the SDK reads (its `code` the one
    `x-ms-error-code` carries)."""
    return {
        "error": {"code": described, "message": error.message},
        "message": error.message,
        "status": error.status,
        **more,
    }


def error_code(code: str, **more: str) -> dict[str, str]:
    return {**more, "x-ms-error-code": code}


IMAGE_REFUSED = UnprocessableContent(
    "The model does not take image parts.",
    param="messages",
    loc=["body", "messages", 0, "content", 1, "type"],
    value="image_url",
    code="UnsupportedContent",
)
N_REFUSED = UnprocessableContent("The model returns one choice.", param="n", value=3)  # no loc

# the errors only this dialect answers its own way; those every dialect answers with the same
# status (its words for them in SHARED_ERRORS) are in test_answers.py
ERRORS = [
    ErrorCase(
        "hidden deployment is 404, as an unknown deployment",
        cases.HIDDEN_DEPLOYMENT,
        404,
        {
            "error": {"code": "DeploymentNotFound", "message": "Deployment 'text-only' not found."},
            "message": "Deployment 'text-only' not found.",
            "status": 404,
        },
        error_code("DeploymentNotFound"),
    ),
    ErrorCase(
        "422 detail: list indices as text, a string value as it is",
        IMAGE_REFUSED,
        422,
        error_body(
            IMAGE_REFUSED,
            "UnsupportedContent",
            code="UnsupportedContent",
            detail={"loc": ["body", "messages", "0", "content", "1", "type"], "value": "image_url"},
        ),
        error_code("UnsupportedContent"),
    ),
    ErrorCase(
        "422 detail without loc points at the param",
        N_REFUSED,
        422,
        error_body(
            N_REFUSED,
            "UnprocessableContent",
            code="UnprocessableContent",
            detail={"loc": ["body", "n"], "value": "3"},
        ),
        error_code("UnprocessableContent"),
    ),
]


# the rows the shared tests (test_answers.py) run for this dialect
TABLES = cases.DialectTables(
    "azure",
    "azure.yaml",
    ("/chat/completions",),
    reads=READS,
    completions=COMPLETIONS,
    streams=STREAMS,
    errors=ERRORS,
    error_body=lambda error, words: error_body(error, words[0], **words[1]),
    error_headers=lambda error, words, headers: error_code(words[0], **headers),
    answers=ANSWERS,
)
