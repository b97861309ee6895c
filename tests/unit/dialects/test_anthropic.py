"""The Anthropic Messages translator (gateway/dialects/anthropic.py), table by table: the system
prompt, content blocks, tools and tool choice read as the canonical conversation; fields with no
meaning here dropped and named; a `Message` of content blocks with every field the vendor marks
required; streams whose every block opens, fills and closes, ending with `message_delta` and
`message_stop`; the stop string that matched; errors as `{"type": "error", …}` with Anthropic's
types (the gateway's 503 said as 529 `overloaded_error`)."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.core.canonical import Choice, Completion, Finish, RefusalDelta, TextDelta, Usage
from gateway.core.errors import BadRequest, GatewayError, ServiceUnavailable
from gateway.dialects.anthropic import AnthropicSSE, tool_use_id
from tests.support.documents import response_errors
from tests.unit.dialects import cases
from tests.unit.dialects.cases import (
    MINIMAL_BODY,
    USER_MESSAGES,
    WEATHER_CALL,
    ErrorCase,
    ReadCase,
    RefusedCase,
    StreamCase,
)

TRANSLATOR = cases.translator("anthropic")
WEATHER_TOOL = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}
WEATHER_FUNCTION = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": WEATHER_TOOL["input_schema"],
        "description": "The weather in a city.",
    },
}
SERVER_TOOL = {"type": "web_search_20250305", "name": "web_search", "max_uses": 2}
CACHE = {"type": "ephemeral"}

# ----- read -------------------------------------------------------------------------------------

READS = [
    ReadCase("minimal body", {}, {}),
    ReadCase(
        "model and max_tokens",
        {"model": "claude-opus-5-5", "max_tokens": 32000},
        {"model": "claude-opus-5-5", "max_tokens": 32000},
    ),
    ReadCase("stream", {"stream": True}, {"stream": True}),
    ReadCase("stop_sequences", {"stop_sequences": ["END", "\n\n"]}, {"stop": ["END", "\n\n"]}),
    ReadCase(
        "sampling (top_k an option)",
        {"temperature": 0.5, "top_p": 0.9, "top_k": 20},
        {"temperature": 0.5, "top_p": 0.9, "options": {"top_k": 20}},
    ),
    ReadCase(
        "system as a string",
        {"system": "Be terse."},
        {"messages": [{"role": "system", "content": "Be terse."}, *USER_MESSAGES]},
    ),
    ReadCase(
        "system as text blocks with cache_control (dropped, named)",
        {
            "system": [
                {"type": "text", "text": "One."},
                {"type": "text", "text": "Two.", "cache_control": CACHE},
            ]
        },
        {
            "messages": [{"role": "system", "content": "One.\nTwo."}, *USER_MESSAGES],
            "dropped": ["cache_control"],
        },
    ),
    ReadCase(
        "a system message inside messages (Claude Code), its output_config dropped",
        {
            "messages": [
                {"role": "user", "content": "Hi"},
                {"role": "system", "content": "Reminder.", "output_config": {"effort": "low"}},
            ]
        },
        {
            "messages": [*USER_MESSAGES, {"role": "system", "content": "Reminder."}],
            "dropped": ["messages.output_config"],
        },
    ),
    ReadCase(
        "text and image blocks (base64 and URL) as content parts",
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "What is this?"},
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"},
                        },
                        {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}},
                    ],
                }
            ]
        },
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "What is this?"},
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO"}},
                        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
                    ],
                }
            ]
        },
    ),
    ReadCase(
        "tool_use then tool_result (string and blocks) as tool calls and tool messages",
        {
            "messages": [
                {"role": "user", "content": "Weather?"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "text", "text": "Looking."},
                        {
                            "type": "tool_use",
                            "id": "toolu_1",
                            "name": "get_weather",
                            "input": {"city": "Paris"},
                        },
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "toolu_1",
                            "content": "sunny",
                            "cache_control": CACHE,
                        },
                        {
                            "type": "tool_result",
                            "tool_use_id": "toolu_2",
                            "is_error": True,
                            "content": [{"type": "text", "text": "no such city"}],
                        },
                        {"type": "text", "text": "And?"},
                    ],
                },
            ]
        },
        {
            "messages": [
                {"role": "user", "content": "Weather?"},
                {
                    "role": "assistant",
                    "content": "Looking.",
                    "tool_calls": [
                        {
                            "id": "toolu_1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},
                {"role": "tool", "tool_call_id": "toolu_2", "content": "no such city"},
                {"role": "user", "content": "And?"},
            ],
            "dropped": ["cache_control"],
        },
    ),
    ReadCase(
        "thinking blocks sent back are dropped, named",
        {
            "messages": [
                {"role": "user", "content": "Hi"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "hm", "signature": "s"},
                        {"type": "text", "text": "Hello"},
                    ],
                },
                {"role": "user", "content": "Again"},
            ]
        },
        {
            "messages": [
                *USER_MESSAGES,
                {"role": "assistant", "content": "Hello"},
                {"role": "user", "content": "Again"},
            ],
            "dropped": ["thinking blocks"],
        },
    ),
    ReadCase(
        "tools as functions; tool_choice tool; no parallel calls",
        {
            "tools": [WEATHER_TOOL],
            "tool_choice": {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
        },
        {
            "tools": [WEATHER_FUNCTION],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "options": {"parallel_tool_calls": False},
        },
    ),
    ReadCase(
        "tool_choice any is required",
        {"tools": [WEATHER_TOOL], "tool_choice": {"type": "any"}},
        {"tools": [WEATHER_FUNCTION], "tool_choice": "required"},
    ),
    ReadCase(
        "tool_choice auto",
        {"tools": [WEATHER_TOOL], "tool_choice": {"type": "auto"}},
        {"tools": [WEATHER_FUNCTION], "tool_choice": "auto"},
    ),
    ReadCase(
        "tool_choice none",
        {"tools": [WEATHER_TOOL], "tool_choice": {"type": "none"}},
        {"tools": [WEATHER_FUNCTION], "tool_choice": "none"},
    ),
    ReadCase(
        "server tools and defer_loading dropped, named",
        {"tools": [{**WEATHER_TOOL, "defer_loading": True}, SERVER_TOOL]},
        {"tools": [WEATHER_FUNCTION], "dropped": ["tools.defer_loading", "tools.web_search"]},
    ),
    ReadCase(
        "metadata.user_id is the user",
        {"metadata": {"user_id": '{"device":"x"}'}},
        {"user": '{"device":"x"}'},
    ),
    ReadCase(
        "fields with no meaning here: dropped, named",
        {
            "thinking": {"type": "adaptive", "display": "updates"},
            "cache_control": CACHE,
            "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
            "output_config": {"effort": "medium"},
            "service_tier": "auto",
            "container": "c1",
            "mcp_servers": [{"type": "url", "url": "https://example.com", "name": "x"}],
            "inference_geo": "us",
        },
        {
            "dropped": [
                "cache_control",
                "container",
                "context_management",
                "inference_geo",
                "mcp_servers",
                "output_config",
                "service_tier",
                "thinking",
            ]
        },
    ),
    ReadCase(
        "an undefined field goes to the extra-parameters policy",
        {"mood": "calm"},
        {"extra": {"mood": "calm"}},
    ),
]

REFUSED = [
    RefusedCase(
        "a tool_use block in a user message",
        {
            "messages": [
                {"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "x", "input": {}}]}
            ]
        },
        BadRequest,
        "BadRequest",
        "messages.0.content.0.type",
        ["body", "messages", 0, "content", 0, "type"],
        "tool_use",
    ),
    RefusedCase(
        "a tool_result block in an assistant message",
        {"messages": [{"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t"}]}]},
        BadRequest,
        "BadRequest",
        "messages.0.content.0.type",
        ["body", "messages", 0, "content", 0, "type"],
        "tool_result",
    ),
]

# ----- stream -----------------------------------------------------------------------------------


def usage(input_tokens: int | None = 0, output_tokens: int = 0) -> dict[str, Any]:
    return {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "cache_creation": None,
        "inference_geo": None,
        "output_tokens_details": None,
        "server_tool_use": None,
        "service_tier": "standard",
    }


MESSAGE_START = {
    "type": "message_start",
    "message": {
        "id": cases.ANSWER_ID,
        "type": "message",
        "role": "assistant",
        "content": [],
        "model": cases.MODEL,
        "stop_reason": None,
        "stop_sequence": None,
        "stop_details": None,
        "container": None,
        "usage": usage(),
    },
}
TEXT_START = {
    "type": "content_block_start",
    "index": 0,
    "content_block": {"type": "text", "text": "", "citations": None},
}


def text_delta(text: str, index: int = 0) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": text}}


def stop(index: int) -> dict[str, Any]:
    return {"type": "content_block_stop", "index": index}


def message_end(reason: str, sequence: str | None = None) -> list[dict[str, Any]]:
    delta_usage = {
        k: v for k, v in usage(3, 2).items() if k not in ("cache_creation", "inference_geo", "service_tier")
    }
    return [
        {
            "type": "message_delta",
            "delta": {
                "stop_reason": reason,
                "stop_sequence": sequence,
                "stop_details": None,
                "container": None,
            },
            "usage": delta_usage,
        },
        {"type": "message_stop"},
    ]


TOOL_START = {
    "type": "content_block_start",
    "index": 1,
    "content_block": {
        "type": "tool_use",
        "id": "toolu_call_1",
        "name": "get_weather",
        "input": {},
        "caller": {"type": "direct"},
    },
}
TOOL_INPUT = {
    "type": "content_block_delta",
    "index": 1,
    "delta": {"type": "input_json_delta", "partial_json": '{"city":"Paris"}'},
}

STREAMS = [
    StreamCase(
        "text: message_start, one block opened, filled, closed; message_delta; message_stop",
        [TextDelta(0, "Hel"), TextDelta(0, "lo"), Finish(0, "stop"), cases.USAGE],
        [MESSAGE_START, TEXT_START, text_delta("Hel"), text_delta("lo"), stop(0), *message_end("end_turn")],
    ),
    StreamCase(
        "text then a tool call: the text block closes before the tool_use block",
        [TextDelta(0, "Looking."), WEATHER_CALL, Finish(0, "tool_calls"), cases.USAGE],
        [
            MESSAGE_START,
            TEXT_START,
            text_delta("Looking."),
            stop(0),
            TOOL_START,
            TOOL_INPUT,
            stop(1),
            *message_end("tool_use"),
        ],
    ),
    StreamCase(
        "the stop sequence that matched",
        [TextDelta(0, "Hi"), Finish(0, "stop_sequence", "END"), cases.USAGE],
        [MESSAGE_START, TEXT_START, text_delta("Hi"), stop(0), *message_end("stop_sequence", "END")],
    ),
    StreamCase(
        "a refusal is text, ending in refusal",
        [RefusalDelta(0, cases.REFUSAL), Finish(0, "content_filter"), cases.USAGE],
        [MESSAGE_START, TEXT_START, text_delta(cases.REFUSAL), stop(0), *message_end("refusal")],
    ),
    StreamCase(
        "an empty answer: no block",
        [cases.SERVED, TextDelta(0, ""), Finish(0, "length"), cases.USAGE],
        [MESSAGE_START, *message_end("max_tokens")],
    ),
]

# ----- error ------------------------------------------------------------------------------------

ERRORS = [
    ErrorCase(
        "a hidden deployment is a permission error",
        cases.HIDDEN_DEPLOYMENT,
        403,
        {
            "type": "error",
            "error": {"type": "permission_error", "message": cases.HIDDEN_DEPLOYMENT.message},
            "request_id": "request-1",
        },
        {"request-id": "request-1"},
    ),
    ErrorCase(
        "a missing field, as Anthropic says it",
        BadRequest('Invalid request body: "max_tokens" is a required property', loc=["body"]),
        400,
        {
            "type": "error",
            "error": {"type": "invalid_request_error", "message": "max_tokens: Field required"},
            "request_id": "request-1",
        },
        {"request-id": "request-1"},
    ),
    ErrorCase(
        "a refused role names messages.N.role",
        BadRequest(
            'Invalid request body: "bot" is not one of "user", "assistant" or "system" '
            "at 'messages[1].role'",
            param="messages[1].role",
            loc=["body", "messages", 1, "role"],
            value="bot",
        ),
        400,
        {
            "type": "error",
            "error": {
                "type": "invalid_request_error",
                "message": 'messages.1.role: "bot" is not one of "user", "assistant" or "system"',
            },
            "request_id": "request-1",
        },
        {"request-id": "request-1"},
    ),
]


def shared_error_body(error: GatewayError, words: Any) -> dict[str, Any]:
    kind, message = words if isinstance(words, tuple) else (words, error.message)
    return {"type": "error", "error": {"type": kind, "message": message}, "request_id": "request-1"}


def shared_error_headers(error: GatewayError, words: Any, headers: dict[str, str]) -> dict[str, str]:
    return {**headers, "request-id": "request-1"}


# the rows the shared tests (test_answers.py) run for this dialect
TABLES = cases.DialectTables(
    "anthropic",
    "anthropic.yaml",
    ("/v1/messages",),
    reads=READS,
    completions=(),
    streams=STREAMS,
    errors=ERRORS,
    refused=REFUSED,
    error_body=shared_error_body,
    error_headers=shared_error_headers,
)

# ----- the dialect's own -----------------------------------------------------------------------


def completion(*choices: Choice, usage: Usage = cases.USAGE) -> dict[str, Any]:
    return TRANSLATOR.completion(cases.answer(), Completion(list(choices), usage))


def message_errors(body: Any) -> list[str]:
    return response_errors("anthropic.yaml", "/v1/messages", "post", 200, body)


def test_a_whole_message_has_every_field_the_vendor_requires():
    body = completion(Choice(0, "Hello", finish_reason="stop"))
    assert body == {
        "id": cases.ANSWER_ID,
        "type": "message",
        "role": "assistant",
        "content": [{"type": "text", "text": "Hello", "citations": None}],
        "model": cases.MODEL,
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "stop_details": None,
        "container": None,
        "usage": usage(3, 2),
    }
    assert message_errors(body) == []


def test_tool_calls_are_tool_use_blocks_after_the_text():
    body = completion(Choice(0, "Looking.", tool_calls=[WEATHER_CALL], finish_reason="tool_calls"))
    assert body["content"] == [
        {"type": "text", "text": "Looking.", "citations": None},
        {
            "type": "tool_use",
            "id": "toolu_call_1",
            "name": "get_weather",
            "input": {"city": "Paris"},
            "caller": {"type": "direct"},
        },
    ]
    assert body["stop_reason"] == "tool_use"
    assert message_errors(body) == []


def test_a_call_that_ends_with_stop_ends_with_tool_use():
    """OpenAI-compatible servers (vLLM) end a call forced by a named tool_choice with `stop`;
    Anthropic ends a message that calls a tool with tool_use, whole or streamed."""
    body = completion(Choice(0, "", tool_calls=[WEATHER_CALL], finish_reason="stop"))
    assert body["stop_reason"] == "tool_use"
    assert completion(Choice(0, "", tool_calls=[WEATHER_CALL], finish_reason="length"))["stop_reason"] == (
        "max_tokens"
    )
    state, answer = TRANSLATOR.new_stream_state(), cases.answer()
    events = [WEATHER_CALL, Finish(0, "stop"), cases.USAGE]
    payloads = [payload for event in events for payload in TRANSLATOR.chunks(answer, event, state)]
    (delta,) = [payload for payload in payloads if payload["type"] == "message_delta"]
    assert delta["delta"]["stop_reason"] == "tool_use"


def test_the_matched_stop_sequence_is_named():
    body = completion(Choice(0, "Hi", finish_reason="stop_sequence", stop_sequence="END"))
    assert (body["stop_reason"], body["stop_sequence"]) == ("stop_sequence", "END")


def test_an_empty_answer_has_no_blocks_and_cached_tokens_are_read():
    detailed = completion(Choice(0, "", finish_reason="length"), usage=cases.DETAILED_USAGE)
    assert detailed["content"] == [] and detailed["stop_reason"] == "max_tokens"
    assert detailed["usage"]["cache_read_input_tokens"] == 4
    assert message_errors(detailed) == []


@pytest.mark.parametrize(
    ("backend_id", "said"),
    [
        ("call_abc", "toolu_call_abc"),
        ("toolu_01X", "toolu_01X"),
        ("chatcmpl-tool-1.2", "toolu_chatcmpl-tool-1_2"),
    ],
)
def test_tool_use_ids(backend_id: str, said: str):
    assert tool_use_id(backend_id) == said


def test_an_error_mid_stream_is_an_error_event():
    state = TRANSLATOR.new_stream_state()
    payload = TRANSLATOR.stream_error(cases.UPSTREAM_TIMEOUT, "request-1", state)
    framed = TRANSLATOR.framing.error(payload)
    assert framed.startswith(b"event: error\ndata: ")
    assert payload == {
        "type": "error",
        "error": {"type": "timeout_error", "message": cases.UPSTREAM_TIMEOUT.message},
        "request_id": "request-1",
    }


def test_the_keepalive_is_a_ping_event():
    assert AnthropicSSE.keepalive == b'event: ping\ndata: {"type":"ping"}\n\n'


def test_overloaded_is_529_with_retry_after():
    rendered = TRANSLATOR.error(ServiceUnavailable("Queue full."), "request-1")
    assert (rendered.status, rendered.headers["retry-after"]) == (529, "1")
    assert rendered.body["error"]["type"] == "overloaded_error"


def test_minimal_body_still_reads_without_tools():
    """tool_choice without tools means nothing: no tool choice is sent on."""
    request = TRANSLATOR.read({**MINIMAL_BODY, "tool_choice": {"type": "any"}})
    assert request.tool_choice is None and request.tools == []
