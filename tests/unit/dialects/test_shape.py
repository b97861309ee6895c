"""The shared base of every translator (gateway/dialects/shape.py), where the dialects agree: how a
body's spellings become the one canonical request, how a stream's events open, carry and close
each choice, how each dialect frames its stream, and that rendering an error leaves it as it was.
What a dialect does differently is in its own test module."""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest

from gateway.core.canonical import Finish, TextDelta, ToolCallDelta
from gateway.core.errors import GatewayError
from gateway.core.parameters import BY_SPELLING
from gateway.dialects.framing import SSE, JSONLines, NamedEventSSE
from gateway.dialects.registry import DIALECTS
from gateway.dialects.shape import OpenAIShaped
from gateway.dialects.translator import DocumentFacts, Translator
from gateway.http.documents import load_document
from tests.support.readers import chat_shaped
from tests.unit.dialects import cases
from tests.unit.dialects.cases import MINIMAL_BODY, USAGE, USAGE_BODY, ReadCase, StreamCase

# A document that defines every parameter the catalogue knows, under every spelling.
EVERY_SPELLING = OpenAIShaped(DocumentFacts(frozenset(BY_SPELLING)))
WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather"}}

READS = [
    ReadCase("minimal body", {}, {}),
    ReadCase("stop as a string becomes a list", {"stop": "END"}, {"stop": ["END"]}),
    ReadCase("stop as a list", {"stop": ["END", "FIN"]}, {"stop": ["END", "FIN"]}),
    ReadCase("stop null is no stop", {"stop": None}, {}),
    ReadCase("max_tokens", {"max_tokens": 5}, {"max_tokens": 5}),
    ReadCase("max_completion_tokens", {"max_completion_tokens": 7}, {"max_tokens": 7}),
    ReadCase(
        "max_completion_tokens wins over max_tokens",
        {"max_tokens": 5, "max_completion_tokens": 7},
        {"max_tokens": 7},
    ),
    ReadCase(
        "max_completion_tokens null leaves max_tokens",
        {"max_tokens": 5, "max_completion_tokens": None},
        {"max_tokens": 5},
    ),
    ReadCase(
        "functions become tools",
        {"functions": [{"name": "get_weather"}]},
        {"tools": [WEATHER_TOOL], "legacy_functions": True},
    ),
    ReadCase(
        "function_call by name becomes a tool_choice",
        {"functions": [{"name": "get_weather"}], "function_call": {"name": "get_weather"}},
        {
            "tools": [WEATHER_TOOL],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "legacy_functions": True,
        },
    ),
    ReadCase(
        "function_call as a word stays that word",
        {"functions": [{"name": "get_weather"}], "function_call": "none"},
        {"tools": [WEATHER_TOOL], "tool_choice": "none", "legacy_functions": True},
    ),
    ReadCase(
        "functions follow tools",
        {"tools": [{"type": "function", "function": {"name": "a"}}], "functions": [{"name": "b"}]},
        {
            "tools": [
                {"type": "function", "function": {"name": "a"}},
                {"type": "function", "function": {"name": "b"}},
            ]
        },
    ),
    ReadCase(
        "tools and tool_choice",
        {"tools": [WEATHER_TOOL], "tool_choice": "required"},
        {"tools": [WEATHER_TOOL], "tool_choice": "required"},
    ),
    ReadCase(
        "stream_options.include_usage",
        {"stream": True, "stream_options": {"include_usage": True}},
        {"stream": True, "include_usage": True},
    ),
    ReadCase(
        "include_usage false",
        {"stream": True, "stream_options": {"include_usage": False}},
        {"stream": True},
    ),
    ReadCase("stream_options null", {"stream": True, "stream_options": None}, {"stream": True}),
    ReadCase(
        "nulls read as the defaults",
        {"stream": None, "n": None, "logprobs": None, "top_logprobs": None},
        {},
    ),
    ReadCase(
        "a catalogue option under its own name",
        {"top_k": 40, "metadata": {"team": "a"}},
        {"options": {"top_k": 40, "metadata": {"team": "a"}}},
    ),
    ReadCase(
        "a parameter no document defines, untouched",
        {"mood": {"calm": [1, 2]}},
        {"extra": {"mood": {"calm": [1, 2]}}},
    ),
]


@pytest.mark.parametrize("case", READS, ids=lambda case: case.id)
def test_read(case: ReadCase):
    assert EVERY_SPELLING.read({**MINIMAL_BODY, **case.body}) == cases.request(**case.expected)


def test_read_leaves_the_body_as_it_was():
    body = {**MINIMAL_BODY, "tools": [WEATHER_TOOL], "functions": [{"name": "b"}], "stop": "END"}
    before = copy.deepcopy(body)
    EVERY_SPELLING.read(body)
    assert body == before


# ----- streams: how the events of each choice open, continue and close ------------------------

BASE = DIALECTS["openai"].translator(DocumentFacts(frozenset()))  # the base shape: OpenAI's
CALL = cases.WEATHER_CALL
SECOND_CALL = ToolCallDelta(index=0, call_index=1, id="call_2", name="get_time", arguments="{}")
SECOND_CALL_BODY = {
    "index": 1,
    "id": "call_2",
    "type": "function",
    "function": {"name": "get_time", "arguments": "{}"},
}


def chunk(index: int, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    """A chunk of the base shape (OpenAI's) for one choice."""
    choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
    return {
        "id": cases.ANSWER_ID,
        "object": "chat.completion.chunk",
        "created": cases.CREATED,
        "model": cases.MODEL,
        "choices": [choice],
    }


OPENS = {"role": "assistant", "content": ""}


STREAMS = [
    StreamCase(
        "a choice opens with a role chunk, once",
        [TextDelta(0, "Hel"), TextDelta(0, "lo")],
        [chunk(0, OPENS), chunk(0, {"content": "Hel"}), chunk(0, {"content": "lo"})],
    ),
    StreamCase(
        "each choice opens on its own",
        [TextDelta(0, "a"), TextDelta(1, "b"), TextDelta(0, "c")],
        [
            chunk(0, OPENS),
            chunk(0, {"content": "a"}),
            chunk(1, OPENS),
            chunk(1, {"content": "b"}),
            chunk(0, {"content": "c"}),
        ],
    ),
    StreamCase(
        "a tool call opens its choice itself, with null content",
        [CALL, SECOND_CALL],
        [
            chunk(
                0,
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"index": 0, **cases.WEATHER_CALL_BODY}],
                },
            ),
            chunk(0, {"tool_calls": [SECOND_CALL_BODY]}),
        ],
    ),
    StreamCase(
        "a tool call after text",
        [TextDelta(0, "Let me look."), CALL],
        [
            chunk(0, OPENS),
            chunk(0, {"content": "Let me look."}),
            chunk(0, {"tool_calls": [{"index": 0, **cases.WEATHER_CALL_BODY}]}),
        ],
    ),
    StreamCase(
        "a finish after text carries only the finish reason",
        [TextDelta(0, "Hi"), Finish(0, "stop")],
        [chunk(0, OPENS), chunk(0, {"content": "Hi"}), chunk(0, {}, "stop")],
    ),
    StreamCase(
        "a finish before any text opens the choice in the same chunk",
        [Finish(0, "length")],
        [chunk(0, OPENS, "length")],
    ),
    StreamCase("usage not asked for: no chunk", [USAGE], []),
    StreamCase(
        "usage asked for: one chunk with no choices",
        [TextDelta(0, "Hi"), Finish(0, "stop"), USAGE],
        [  # OpenAI's: `usage` null in every chunk before the usage chunk
            {**chunk(0, OPENS), "usage": None},
            {**chunk(0, {"content": "Hi"}), "usage": None},
            {**chunk(0, {}, "stop"), "usage": None},
            {
                "id": cases.ANSWER_ID,
                "object": "chat.completion.chunk",
                "created": cases.CREATED,
                "model": cases.MODEL,
                "choices": [],
                "usage": USAGE_BODY,
            },
        ],
        include_usage=True,
    ),
]


@pytest.mark.parametrize("case", STREAMS, ids=lambda case: case.id)
def test_stream(case: StreamCase):
    assert cases.stream(BASE, case.events, include_usage=case.include_usage) == case.expected


EVERY_KIND_OF_EVENT = [
    TextDelta(0, "Hi"),
    TextDelta(1, "Yo"),
    CALL,
    Finish(0, "stop"),
    Finish(1, "length"),
    Finish(2, "content_filter"),
    USAGE,
]


# Whether a stream ends with a usage chunk: (usage not asked for, asked for), per translator; a
# dialect that reuses a translator (a subclass) is held to what it does.
USAGE_CHUNKS = {
    "OpenAITranslator": (0, 1),
    "AzureTranslator": (0, 0),  # azure.yaml: always, on the last finish chunk (test_azure.py)
    "AlephAlphaTranslator": (0, 1),
    "LMITranslator": (0, 0),  # LMI's stream has no usage (its document has no stream_options)
    "OVMSTranslator": (0, 1),
}


def expected_usage_chunks(translator: Translator[Any]) -> tuple[int, int]:
    """The row of the nearest class in the translator's ancestry that has one (a new translator
    with none fails here, naming itself)."""
    for cls in type(translator).__mro__:
        if cls.__name__ in USAGE_CHUNKS:
            return USAGE_CHUNKS[cls.__name__]
    raise AssertionError(f"{type(translator).__name__}: add its row to USAGE_CHUNKS")


@pytest.mark.parametrize("include_usage", [False, True], ids=["usage not asked for", "usage asked for"])
@pytest.mark.parametrize("dialect_name", sorted(chat_shaped()))  # streams of `choices` chunks
def test_a_chunk_without_choices_is_the_usage_chunk(dialect_name: str, include_usage: bool):
    """A client reads `choices[0]` of every chunk but the usage one; an empty one anywhere else
    breaks it. Every other chunk has no usage (absent, or null where the document says so)."""
    chunks = cases.stream(cases.translator(dialect_name), EVERY_KIND_OF_EVENT, include_usage=include_usage)
    without_choices = [chunk for chunk in chunks if not chunk["choices"]]
    assert all(chunk.get("usage") for chunk in without_choices)
    assert len(without_choices) == expected_usage_chunks(cases.translator(dialect_name))[include_usage]
    assert all(chunk.get("usage") is None for chunk in chunks[:-1] if chunk["choices"])
    if without_choices:
        assert chunks[-1] is without_choices[0]


# ----- framing ----------------------------------------------------------------------------------

# The framing a dialect's stream has, from its document: the media type its chat operations
# declare for a streamed 200 (SSE ends with `[DONE]`; JSON lines have no end marker).
FRAMING_BY_MEDIA_TYPE = {
    "text/event-stream": (SSE, b'data: {"a":1}\n\n', b"data: [DONE]\n\n"),
    "application/jsonlines": (JSONLines, b'{"a":1}\n', None),
}


def streamed_media_type(dialect_name: str) -> str:
    dialect = DIALECTS[dialect_name]
    document = load_document(dialect.document)
    found = {
        media_type
        for item in document["paths"].values()
        for method, operation in item.items()
        if method == "post" and operation["operationId"] in dialect.chat_operations
        for media_type in operation["responses"]["200"]["content"]
        if media_type != "application/json"
    }
    assert len(found) == 1, f"{dialect_name}: one streamed media type, not {found}"
    return found.pop()


@pytest.mark.parametrize("dialect_name", DIALECTS)
def test_framing(dialect_name: str):
    translator = cases.translator(dialect_name)
    if isinstance(translator.framing, NamedEventSSE):  # events named by their `type`
        assert streamed_media_type(dialect_name) == "text/event-stream"
        assert translator.framing.frame({"type": "a"}) == b'event: a\ndata: {"type":"a"}\n\n'
        assert translator.framing.done is None
        return
    framing, frame, done = FRAMING_BY_MEDIA_TYPE[streamed_media_type(dialect_name)]
    assert isinstance(translator.framing, framing)
    assert translator.framing.frame({"a": 1}) == frame
    assert translator.framing.done == done


def test_named_event_framing_names_each_event_by_its_type():
    """Anthropic's Messages and OpenAI's Responses streams: `event: <type>`, then its data; an
    error mid-stream is an event like the others (its type, `error`); no end marker."""
    framing = NamedEventSSE()
    assert framing.frame({"type": "message_start", "n": 1}) == (
        b'event: message_start\ndata: {"type":"message_start","n":1}\n\n'
    )
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}
    assert framing.error(error) == b"event: error\ndata: " + orjson.dumps(error) + b"\n\n"
    assert framing.done is None and framing.media_type == "text/event-stream"


# ----- errors -----------------------------------------------------------------------------------

SHARED_ERRORS = [
    cases.INVALID_BODY,
    cases.PROMPT_FILTERED,
    cases.HIDDEN_DEPLOYMENT,
    cases.WRONG_METHOD,
    cases.UNSUPPORTED_PARAMETER,
    cases.RATE_LIMITED,
    cases.NO_REPLICA,
]


@pytest.mark.parametrize("dialect_name", sorted(DIALECTS))
@pytest.mark.parametrize("error", SHARED_ERRORS, ids=lambda error: type(error).__name__)
def test_rendering_an_error_leaves_it_as_it_was(dialect_name: str, error: GatewayError):
    """Errors are built once and rendered many times (mid-stream, per dialect): rendering must
    not change them, nor hand out their own headers to be changed."""
    translator = cases.translator(dialect_name)
    before = (type(error), error.status, error.code, error.message, dict(error.headers))
    first = translator.error(error, "request-1")
    first.headers["x-added-later"] = "1"
    second = translator.error(error, "request-2")
    assert (type(error), error.status, error.code, error.message, dict(error.headers)) == before
    assert "x-added-later" not in second.headers
    # the same body but for the request's id, where the dialect's body names it (Anthropic's)
    assert {**second.body, "request_id": None} == {**first.body, "request_id": None}
