"""The Responses API's translator: bodies as clients send them read into the canonical request,
whole answers and every stream event held to openapi/openai.yaml (objects closed) and to OpenAI's
own document's schemas (`Response`, each `ResponseStreamEvent` variant), sequence numbers and the
lifecycle's order."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest

from gateway.app import facts_of
from gateway.core.canonical import (
    ChatRequest,
    Choice,
    Completion,
    Event,
    Finish,
    RefusalDelta,
    TextDelta,
    TokenLogprob,
    ToolCallDelta,
    TopLogprob,
    Usage,
)
from gateway.core.errors import BadGateway, BadRequest
from gateway.dialects.openai import OpenAITranslator
from gateway.dialects.responses import ResponsesTranslator
from gateway.dialects.translator import Answer
from gateway.http.documents import load_document
from gateway.tools.vendor_specs import validator
from tests.support.documents import response_errors
from tests.unit.dialects.cases import chunk_errors

TRANSLATOR = ResponsesTranslator(
    facts_of(load_document("openai.yaml"), ("createResponse",)), errors=OpenAITranslator
)
USAGE = Usage(12, 5)


def read(body: dict[str, Any]) -> ChatRequest:
    return TRANSLATOR.read(body)


def answer_for(body: dict[str, Any]) -> Answer:
    return Answer(id="resp_abc", created=1_700_000_000, model="echo", request=read(body))


def stream(body: dict[str, Any], events: list[Event]) -> list[dict[str, Any]]:
    answer, state = answer_for(body), TRANSLATOR.new_stream_state()
    return [payload for event in events for payload in TRANSLATOR.chunks(answer, event, state)]


@functools.cache
def vendor(refspecs: Path, kind: str) -> Any:
    check = validator(refspecs, "openai", kind)
    assert check is not None
    return check


def held_to_both(refspecs: Path, kind: str, body: Any, media_type: str = "application/json") -> None:
    """Valid for OpenAI's schema of `kind` and for our document's answer (objects closed)."""
    assert vendor(refspecs, kind)(body) == []
    if media_type == "text/event-stream":
        assert chunk_errors("openai.yaml", "/responses", body) == []
    else:
        assert response_errors("openai.yaml", "/responses", "post", 200, body) == []


# ----- reading --------------------------------------------------------------------------------


def test_a_string_input_is_one_user_message_after_the_instructions():
    request = read({"model": "m", "input": "hi", "instructions": "Be brief."})
    assert request.messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert request.include_usage and not request.stream


def test_items_become_chat_messages():
    request = read(
        {
            "model": "m",
            "input": [
                {"type": "message", "role": "developer", "content": "rules", "id": "msg_client1"},
                {"role": "user", "content": [
                    {"type": "input_text", "text": "look"},
                    {"type": "input_image", "image_url": "data:image/png;base64,AA"},
                ]},
                {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "opaque"},
                {"type": "message", "role": "assistant",
                 "content": [{"type": "output_text", "text": "Let me check.", "annotations": []}]},
                {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "f", "arguments": "{}"},
                {"type": "function_call", "id": "fc_2", "call_id": "call_2", "name": "g", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "call_1", "output": "one"},
                {"type": "function_call_output", "call_id": "call_2",
                 "output": [{"type": "input_text", "text": "two"}]},
            ],
        }
    )  # fmt: skip
    assert request.messages == [
        {"role": "system", "content": "rules"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}},
            ],
        },
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                {"id": "call_2", "type": "function", "function": {"name": "g", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "one"},
        {"role": "tool", "tool_call_id": "call_2", "content": "two"},
    ]
    assert request.dropped == []


def test_text_parts_are_a_string_and_a_lone_call_has_no_null_content():
    """As chat clients send them: llama.cpp's server refuses a system message in parts and an
    assistant message whose content is null (Codex CLI sends every message in parts, and its
    instructions as two); text parts are joined by newlines, as vLLM joins them."""
    two = [{"type": "input_text", "text": "rules"}, {"type": "input_text", "text": "more rules"}]
    request = read(
        {
            "model": "m",
            "input": [
                {"role": "developer", "content": two},
                {"role": "user", "content": [{"type": "input_text", "text": "go"}]},
                {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "call_1", "output": "done"},
            ],
        }
    )
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    assert request.messages == [
        {"role": "system", "content": "rules\nmore rules"},
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "done"},
    ]


def test_function_tools_are_offered_and_hosted_ones_dropped_and_named():
    request = read(
        {
            "model": "m",
            "input": "x",
            "tools": [
                {"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": True},
                {"type": "web_search", "external_web_access": False},
                {"type": "namespace", "name": "multi_agent_v1", "tools": []},
            ],
            "tool_choice": {"type": "function", "name": "f"},
            "parallel_tool_calls": False,
        }
    )
    assert request.tools == [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}, "strict": True}}
    ]
    assert request.tool_choice == {"type": "function", "function": {"name": "f"}}
    assert request.options == {"parallel_tool_calls": False}
    assert request.dropped == ["tools:web_search", "tools:namespace"]


def test_text_format_becomes_the_response_format():
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    request = read(
        {
            "model": "m",
            "input": "x",
            "text": {"format": {"type": "json_schema", "name": "A", "schema": schema, "strict": True}},
        }
    )
    assert request.response_format == {
        "type": "json_schema",
        "json_schema": {"name": "A", "schema": schema, "strict": True},
    }
    assert read(
        {"model": "m", "input": "x", "text": {"format": {"type": "json_object"}}}
    ).response_format == {"type": "json_object"}
    assert read({"model": "m", "input": "x", "text": {"format": {"type": "text"}}}).response_format is None


def test_sampling_and_limits_are_read():
    request = read(
        {
            "model": "m",
            "input": "x",
            "max_output_tokens": 64,
            "temperature": 0.5,
            "top_p": 0.9,
            "top_logprobs": 2,
        }
    )
    assert (request.max_tokens, request.temperature, request.top_p) == (64, 0.5, 0.9)
    assert request.logprobs and request.top_logprobs == 2


def test_unknown_keys_go_to_the_extra_parameters_policy():
    request = read({"model": "m", "input": "x", "a_future_field": {"a": 1}, "store": False})
    assert request.extra == {"a_future_field": {"a": 1}}


def test_codex_client_metadata_is_a_known_field():
    """Codex CLI sends it on every request: it is read, not refused by the default policy."""
    request = read({"model": "m", "input": "x", "client_metadata": {"session_id": "s"}})
    assert request.extra == {}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"background": True}, "background"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"prompt": {"id": "pmpt_1"}}, "prompt"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "file_1"}]}]},
            "input.0.content.0",
        ),
    ],
)
def test_what_nothing_here_keeps_is_refused_by_name(body: dict[str, Any], param: str):
    with pytest.raises(BadRequest) as refused:
        read({"model": "m", "input": "x", **body})
    assert refused.value.param == param


# ----- whole answers --------------------------------------------------------------------------


def test_a_whole_answer_holds_to_both_documents(refspecs: Path):
    body = {"model": "m", "input": "x", "tools": [{"type": "function", "name": "f"}], "metadata": {"k": "v"}}
    completion = Completion(
        [
            Choice(
                0,
                text="Calling.",
                tool_calls=[ToolCallDelta(0, 0, "call_9", "f", '{"a":1}')],
                finish_reason="tool_calls",
            )
        ],
        USAGE,
    )
    response = TRANSLATOR.completion(answer_for(body), completion)
    held_to_both(refspecs, "response", response)
    assert [item["type"] for item in response["output"]] == ["message", "function_call"]
    call = response["output"][1]
    assert call["call_id"] == "call_9" and call["id"].startswith("fc_") and call["arguments"] == '{"a":1}'
    assert response["usage"] == {
        "input_tokens": 12,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": 5,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 17,
    }
    assert response["metadata"] == {"k": "v"} and response["status"] == "completed"


def test_a_cut_answer_is_incomplete_for_max_output_tokens(refspecs: Path):
    completion = Completion([Choice(0, text="abc", finish_reason="length")], USAGE)
    response = TRANSLATOR.completion(
        answer_for({"model": "m", "input": "x", "max_output_tokens": 16}), completion
    )
    held_to_both(refspecs, "response", response)
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert response["output"][0]["status"] == "incomplete"


def test_a_refusal_is_a_refusal_part(refspecs: Path):
    completion = Completion([Choice(0, refusal="No.", finish_reason="stop")], USAGE)
    response = TRANSLATOR.completion(answer_for({"model": "m", "input": "x"}), completion)
    held_to_both(refspecs, "response", response)
    assert response["output"][0]["content"] == [{"type": "refusal", "refusal": "No."}]


# ----- streams --------------------------------------------------------------------------------


TEXT_EVENTS: list[Event] = [TextDelta(0, "Hel"), TextDelta(0, "lo"), Finish(0, "stop"), USAGE]


def test_a_text_stream_runs_the_whole_lifecycle_in_order(refspecs: Path):
    payloads = stream({"model": "m", "input": "x"}, TEXT_EVENTS)
    for payload in payloads:
        held_to_both(refspecs, "response_event", payload, "text/event-stream")
    assert [p["type"] for p in payloads] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [p["sequence_number"] for p in payloads] == list(range(len(payloads)))
    assert payloads[2]["item"]["content"] == [] and payloads[2]["item"]["status"] == "in_progress"
    assert payloads[6]["text"] == "Hello"
    assert payloads[8]["item"]["content"][0]["text"] == "Hello"  # Codex reads the text here
    assert payloads[9]["response"]["output"] == [payloads[8]["item"]]
    assert payloads[9]["response"]["output_text"] == "Hello"
    assert payloads[0]["response"]["status"] == "in_progress" and "usage" not in payloads[0]["response"]


def test_a_tool_call_stream_writes_the_arguments_events(refspecs: Path):
    events: list[Event] = [ToolCallDelta(0, 0, "call_1", "f", '{"x":1}'), Finish(0, "tool_calls"), USAGE]
    payloads = stream({"model": "m", "input": "x", "tools": [{"type": "function", "name": "f"}]}, events)
    for payload in payloads:
        held_to_both(refspecs, "response_event", payload, "text/event-stream")
    assert [p["type"] for p in payloads] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    added, done = payloads[2]["item"], payloads[5]["item"]
    assert added["arguments"] == "" and added["status"] == "in_progress"
    assert done == {**added, "arguments": '{"x":1}', "status": "completed"}
    assert payloads[4]["name"] == "f" and payloads[4]["arguments"] == '{"x":1}'


def test_text_then_a_call_closes_the_message_first(refspecs: Path):
    events: list[Event] = [
        TextDelta(0, "Let me."),
        ToolCallDelta(0, 0, "c", "f", "{}"),
        Finish(0, "tool_calls"),
        USAGE,
    ]
    payloads = stream({"model": "m", "input": "x"}, events)
    kinds = [p["type"] for p in payloads]
    assert kinds.index("response.output_item.done") < kinds.index("response.function_call_arguments.done")
    final = payloads[-1]["response"]
    assert [item["type"] for item in final["output"]] == ["message", "function_call"]
    assert [p.get("output_index") for p in payloads if p["type"] == "response.output_item.added"] == [0, 1]
    held_to_both(refspecs, "response", final)


def test_a_cut_stream_ends_incomplete(refspecs: Path):
    payloads = stream({"model": "m", "input": "x"}, [TextDelta(0, "ab"), Finish(0, "length"), USAGE])
    assert payloads[-1]["type"] == "response.incomplete"
    assert payloads[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    held_to_both(refspecs, "response_event", payloads[-1], "text/event-stream")


def test_a_refusal_streams_its_own_events(refspecs: Path):
    payloads = stream({"model": "m", "input": "x"}, [RefusalDelta(0, "No"), Finish(0, "stop"), USAGE])
    for payload in payloads:
        held_to_both(refspecs, "response_event", payload, "text/event-stream")
    assert "response.refusal.delta" in [p["type"] for p in payloads]
    assert "response.refusal.done" in [p["type"] for p in payloads]


def test_each_delta_says_where_its_part_is(refspecs: Path):
    """Text, a refusal, text again, a call, then text: each delta carries its own part's
    item_id, output_index and content_index, those its `content_part.added` said."""
    events: list[Event] = [
        TextDelta(0, "a"),
        TextDelta(0, "b"),
        RefusalDelta(0, "no"),
        TextDelta(0, "c"),
        ToolCallDelta(0, 0, "call_1", "f", "{}"),
        TextDelta(0, "d"),
        TextDelta(0, "e"),
        Finish(0, "stop"),
        USAGE,
    ]
    payloads = stream({"model": "m", "input": "x", "tools": [{"type": "function", "name": "f"}]}, events)
    for payload in payloads:
        held_to_both(refspecs, "response_event", payload, "text/event-stream")
    place = ("item_id", "output_index", "content_index")
    opened, deltas = [], []
    for payload in payloads:
        where = tuple(payload.get(key) for key in place)
        if payload["type"] == "response.content_part.added":
            opened.append(where)
        elif payload["type"] in ("response.output_text.delta", "response.refusal.delta"):
            deltas.append((where, payload["delta"]))
    first, second = (
        p["item"]["id"]
        for p in payloads
        if p["type"] == "response.output_item.added" and p["item"]["type"] == "message"
    )
    assert opened == [(first, 0, 0), (first, 0, 1), (first, 0, 2), (second, 2, 0)]
    assert deltas == [
        ((first, 0, 0), "a"),
        ((first, 0, 0), "b"),
        ((first, 0, 1), "no"),
        ((first, 0, 2), "c"),
        ((second, 2, 0), "d"),
        ((second, 2, 0), "e"),
    ]
    output = payloads[-1]["response"]["output"]
    assert [part.get("text", part.get("refusal")) for part in output[0]["content"]] == ["ab", "no", "c"]
    assert [part["text"] for part in output[2]["content"]] == ["de"]


def test_logprobs_ride_on_the_deltas(refspecs: Path):
    logprobs = [TokenLogprob("Hi", -0.1, [TopLogprob("Hi", -0.1), TopLogprob("Yo", -2.0)])]
    payloads = stream(
        {"model": "m", "input": "x", "top_logprobs": 2},
        [TextDelta(0, "Hi", logprobs), Finish(0, "stop"), USAGE],
    )
    for payload in payloads:
        held_to_both(refspecs, "response_event", payload, "text/event-stream")
    delta = next(p for p in payloads if p["type"] == "response.output_text.delta")
    assert delta["logprobs"][0]["token"] == "Hi" and len(delta["logprobs"][0]["top_logprobs"]) == 2


def test_an_error_after_the_start_is_an_error_event(refspecs: Path):
    answer, state = answer_for({"model": "m", "input": "x"}), TRANSLATOR.new_stream_state()
    opened = TRANSLATOR.chunks(answer, TextDelta(0, "a"), state)
    error = TRANSLATOR.stream_error(BadGateway("upstream broke"), "req", state)
    held_to_both(refspecs, "response_event", error, "text/event-stream")
    assert error["type"] == "error" and error["sequence_number"] == opened[-1]["sequence_number"] + 1
    assert error["message"] == "upstream broke"


def test_an_item_reference_waits_for_the_stored_conversation():
    request = read(
        {"model": "m", "input": [{"type": "item_reference", "id": "msg_1"}, {"role": "user", "content": "x"}]}
    )
    assert request.echo.references and request.messages == [{"role": "user", "content": "x"}]


def test_the_response_lists_only_the_tools_offered():
    body = {"model": "m", "input": "x", "tools": [{"type": "web_search"}, {"type": "function", "name": "f"}]}
    response = TRANSLATOR.completion(
        answer_for(body), Completion([Choice(0, text="a", finish_reason="stop")], USAGE)
    )
    assert response["tools"] == [
        {"type": "function", "name": "f", "description": None, "parameters": None, "strict": None}
    ]
