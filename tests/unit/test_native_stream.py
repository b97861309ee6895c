"""The native pass-through's readers (backends/native_stream.py): recorded Messages and Responses
streams read into canonical events carrying their frames, and the broken orders real servers
send (llama.cpp's server without `message_start`, with `response.created` twice) refused as
upstream failures."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from backends.http.stream_decoders import SSEDecoder
from backends.native_stream import (
    MessagesStream,
    ResponsesStream,
    messages_body,
    relayed,
    responses_body,
)
from gateway.core.canonical import Finish, Passed, TextDelta, ToolCallDelta, Usage
from gateway.core.errors import BadGateway

pytestmark = pytest.mark.unit


def message_start(input_tokens: int = 9) -> dict[str, Any]:
    return {
        "type": "message_start",
        "message": {
            "id": "msg_up",
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": "tiny",
            "usage": {"input_tokens": input_tokens, "output_tokens": 0, "cache_read_input_tokens": 4},
        },
    }


def text_block(index: int, *texts: str) -> list[dict[str, Any]]:
    return [
        {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}},
        *(
            {"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": t}}
            for t in texts
        ),
        {"type": "content_block_stop", "index": index},
    ]


MESSAGE_END = [
    {
        "type": "message_delta",
        "delta": {"stop_reason": "max_tokens", "stop_sequence": None},
        "usage": {"output_tokens": 8},
    },
    {"type": "message_stop"},
]

GOOD_MESSAGES = [
    message_start(),
    {"type": "ping"},
    {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "hm"}},
    {"type": "content_block_stop", "index": 0},
    *text_block(1, "Hel", "lo"),
    {
        "type": "content_block_start",
        "index": 2,
        "content_block": {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}},
    },
    {
        "type": "content_block_delta",
        "index": 2,
        "delta": {"type": "input_json_delta", "partial_json": '{"city"'},
    },
    {
        "type": "content_block_delta",
        "index": 2,
        "delta": {"type": "input_json_delta", "partial_json": ': "Oslo"}'},
    },
    {"type": "content_block_stop", "index": 2},
    *MESSAGE_END,
]


def read_all(reader: MessagesStream | ResponsesStream, frames: list[dict[str, Any]]) -> list[Any]:
    events = []
    for frame in frames:
        events += reader.feed(frame)
    return events


def test_a_whole_messages_stream_reads_into_events_that_carry_every_frame() -> None:
    reader = MessagesStream()
    events = read_all(reader, GOOD_MESSAGES)
    assert reader.ended
    # every frame is carried once, in order, by the event it became
    carried = [frame for event in events for frame in event.frames]
    assert carried == GOOD_MESSAGES
    texts = [e.text for e in events if isinstance(e, TextDelta)]
    assert texts == ["Hel", "lo"]
    (call,) = [e for e in events if isinstance(e, ToolCallDelta)]
    assert (call.id, call.name, orjson.loads(call.arguments)) == ("toolu_1", "get_weather", {"city": "Oslo"})
    (finish,) = [e for e in events if isinstance(e, Finish)]
    assert finish.reason == "length"
    usage = events[-1]
    assert isinstance(usage, Usage)
    # the prompt counts the cached tokens too, as Anthropic's input_tokens leaves them out
    assert (usage.prompt_tokens, usage.completion_tokens) == (13, 8)
    assert usage.prompt_tokens_details is not None and usage.prompt_tokens_details.cached_tokens == 4
    assert isinstance(events[0], Passed)


# llama.cpp's server when the first token is an incomplete UTF-8 sequence: no message_start
LLAMA_NO_MESSAGE_START = [*text_block(0, "\ufffdP", "ke"), *MESSAGE_END]


@pytest.mark.parametrize(
    ("frames", "said"),
    [
        (LLAMA_NO_MESSAGE_START, "'content_block_start' before message_start"),
        ([message_start(), message_start()], "a second message_start"),
        (
            [
                message_start(),
                {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "x"}},
            ],
            "a delta for block 0, which is not open",
        ),
        ([message_start(), *text_block(0, "a")[:2], *MESSAGE_END], "message_delta while block 0 is open"),
        ([message_start(), *text_block(0, "a"), MESSAGE_END[1]], "message_stop before message_delta"),
        ([message_start(), *text_block(0, "a"), *MESSAGE_END, {"type": "ping"}], "'ping' after message_stop"),
        ([message_start(), *text_block(0, "a"), *text_block(0, "b")], "block 0 started twice"),
        ([message_start(), {"type": "content_block_stop", "index": 3}], "block 3 stopped but not open"),
    ],
)
def test_a_messages_stream_out_of_order_is_an_upstream_failure(
    frames: list[dict[str, Any]], said: str
) -> None:
    reader = MessagesStream()
    with pytest.raises(BadGateway) as raised:
        read_all(reader, frames)
    assert said in raised.value.message
    assert raised.value.status == 502


def test_an_error_event_in_a_messages_stream_is_the_upstreams_failure() -> None:
    reader = MessagesStream()
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    with pytest.raises(BadGateway, match="Overloaded"):
        read_all(reader, [message_start(), error])


def created(kind: str = "response.created", sequence: int = 0) -> dict[str, Any]:
    return {
        "type": kind,
        "sequence_number": sequence,
        "response": {
            "id": "resp_up",
            "object": "response",
            "model": "tiny",
            "status": "in_progress",
            "output": [],
        },
    }


def message_item(index: int, *deltas: str) -> list[dict[str, Any]]:
    item = {"id": "msg_1", "type": "message", "role": "assistant", "status": "in_progress", "content": []}
    where = {"item_id": "msg_1", "output_index": index, "content_index": 0}
    text = "".join(deltas)
    return [
        {"type": "response.output_item.added", "output_index": index, "item": item},
        {"type": "response.content_part.added", **where, "part": {"type": "output_text", "text": ""}},
        *({"type": "response.output_text.delta", **where, "delta": d} for d in deltas),
        {"type": "response.output_text.done", **where, "text": text},
        {"type": "response.content_part.done", **where, "part": {"type": "output_text", "text": text}},
        {"type": "response.output_item.done", "output_index": index, "item": {**item, "status": "completed"}},
    ]


def completed(status: str = "completed") -> dict[str, Any]:
    response = {
        "id": "resp_up",
        "object": "response",
        "model": "tiny",
        "status": status,
        "output": [],
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "usage": {"input_tokens": 9, "output_tokens": 8, "input_tokens_details": {"cached_tokens": 8}},
    }
    return {"type": f"response.{status}", "response": response}


FUNCTION_CALL = [
    {
        "type": "response.output_item.added",
        "output_index": 1,
        "item": {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "f", "arguments": ""},
    },
    {"type": "response.function_call_arguments.delta", "output_index": 1, "item_id": "fc_1", "delta": "{}"},
    {
        "type": "response.output_item.done",
        "output_index": 1,
        "item": {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "f", "arguments": "{}"},
    },
]
GOOD_RESPONSES = [
    created(),
    created("response.in_progress", 1),
    *message_item(0, "Hel", "lo"),
    *FUNCTION_CALL,
    completed(),
]


def test_a_whole_responses_stream_reads_into_events_that_carry_every_frame() -> None:
    reader = ResponsesStream()
    events = read_all(reader, GOOD_RESPONSES)
    assert reader.ended
    assert [frame for event in events for frame in event.frames] == GOOD_RESPONSES
    assert [e.text for e in events if isinstance(e, TextDelta)] == ["Hel", "lo"]
    (call,) = [e for e in events if isinstance(e, ToolCallDelta)]
    assert (call.id, call.name, call.arguments) == ("call_1", "f", "{}")
    finish, usage = events[-2:]
    assert isinstance(finish, Finish) and finish.reason == "tool_calls"
    assert isinstance(usage, Usage) and (usage.prompt_tokens, usage.completion_tokens) == (9, 8)


def test_an_incomplete_response_finishes_for_its_reason() -> None:
    events = read_all(ResponsesStream(), [created(), *message_item(0, "a"), completed("incomplete")])
    assert [e.reason for e in events if isinstance(e, Finish)] == ["length"]


# llama.cpp's server when the first token is an incomplete UTF-8 sequence (the audit's order)
LLAMA_CREATED_TWICE = [
    created(),
    created("response.in_progress", 1),
    *message_item(0, "\ufffdP")[:3],
    created("response.created", 4),
]


@pytest.mark.parametrize(
    ("frames", "said"),
    [
        (LLAMA_CREATED_TWICE, "a second response.created"),
        (message_item(0, "a"), "'response.output_item.added' before response.created"),
        (
            [created(), *message_item(0, "a")[:3], completed()],
            "'response.completed' while output item 0 is open",
        ),
        ([created(), *message_item(0, "a"), completed(), completed()], "after the terminal event"),
        (
            [created(), *message_item(0, "a")[2:]],
            "'response.output_text.delta' for output item 0, which is not open",
        ),
        ([created(), *message_item(0, "a"), *message_item(0, "b")], "output item 0 added twice"),
        ([created(), message_item(0)[0], message_item(0)[-1], message_item(0)[-1]], "which is not open"),
        (
            [created(), *message_item(0, "a")[:1], message_item(0, "a")[2]],
            "content part 0, which is not open",
        ),
    ],
)
def test_a_responses_stream_out_of_order_is_an_upstream_failure(
    frames: list[dict[str, Any]], said: str
) -> None:
    with pytest.raises(BadGateway) as raised:
        read_all(ResponsesStream(), frames)
    assert said in raised.value.message


def test_a_failed_response_or_an_error_event_is_the_upstreams_failure() -> None:
    failed = {
        "type": "response.failed",
        "response": {"status": "failed", "error": {"message": "engine died"}},
    }
    with pytest.raises(BadGateway, match="engine died"):
        read_all(ResponsesStream(), [created(), failed])
    with pytest.raises(BadGateway, match="boom"):
        read_all(ResponsesStream(), [created(), {"type": "error", "code": "x", "message": "boom"}])


def test_whole_answers_carry_the_upstreams_body_on_their_usage() -> None:
    message = {
        "id": "msg_up",
        "type": "message",
        "role": "assistant",
        "model": "tiny",
        "content": [
            {"type": "text", "text": "hi"},
            {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": 1}},
        ],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 3, "output_tokens": 5},
    }
    events = messages_body(message)
    assert events[-1] == Usage(3, 5, frames=[message])
    assert [type(e) for e in events] == [TextDelta, ToolCallDelta, Finish, Usage]
    assert isinstance(events[2], Finish) and events[2].reason == "tool_calls"
    response = {**completed("incomplete")["response"], "output": message_item(0, "hi")[-1:][0]["item"] | {}}
    response["output"] = [{"type": "message", "content": [{"type": "output_text", "text": "hi"}]}]
    events = responses_body(response)
    assert [e.text for e in events if isinstance(e, TextDelta)] == ["hi"]
    assert events[-1].frames == [response]
    assert isinstance(events[-2], Finish) and events[-2].reason == "length"
    with pytest.raises(BadGateway):
        messages_body({"type": "error", "error": {"type": "api_error", "message": "no"}})
    with pytest.raises(BadGateway):
        responses_body({"object": "list"})


def sse(frames: list[dict[str, Any]]) -> list[bytes]:
    return [f"event: {f['type']}\ndata: {orjson.dumps(f).decode()}\n\n".encode() for f in frames]


def relay(pieces: list[bytes], reader: MessagesStream | ResponsesStream) -> list[list[Any]]:
    async def run() -> list[list[Any]]:
        feed = iter([*pieces, b""])

        async def read() -> bytes:
            return next(feed)

        loop = asyncio.get_running_loop()
        later = loop.time() + 5
        return [batch async for batch in relayed(read, SSEDecoder(), reader, later, later)]

    return asyncio.run(run())


def test_the_relay_holds_what_comes_before_the_first_token_and_goes_with_it() -> None:
    batches = relay(sse(GOOD_MESSAGES), MessagesStream())
    first = batches[0]
    # message_start, ping and the thinking block wait for the first text: one batch
    assert isinstance(first[-1], TextDelta) and first[-1].text == "Hel"
    assert all(isinstance(e, Passed) for e in first[:-1])
    assert [f for batch in batches for e in batch for f in e.frames] == GOOD_MESSAGES


def test_the_relay_refuses_a_stream_cut_before_its_end() -> None:
    with pytest.raises(BadGateway, match="closed the stream before the answer was finished"):
        relay(sse(GOOD_MESSAGES[:-1]), MessagesStream())
    with pytest.raises(BadGateway, match="before message_start"):
        relay(sse(LLAMA_NO_MESSAGE_START), MessagesStream())
