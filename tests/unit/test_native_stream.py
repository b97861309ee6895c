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
from gateway.core.deadline import Deadline
from gateway.core.errors import BadGateway
from tests.support.native_frames import (
    GOOD_MESSAGES,
    GOOD_RESPONSES,
    LLAMA_CREATED_TWICE,
    LLAMA_NO_MESSAGE_START,
    MESSAGE_END,
    completed,
    created,
    llama_unindexed,
    message_item,
    message_start,
    text_block,
)

pytestmark = pytest.mark.unit


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
            "content part 0 of item 0, which is not open",
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

        later = asyncio.get_running_loop().time() + 5
        until = Deadline(later)
        try:
            return [batch async for batch in relayed(read, SSEDecoder(), reader, until, later)]
        finally:
            until.close()

    return asyncio.run(run())


def test_the_relay_holds_what_only_opens_the_answer_until_something_is_said() -> None:
    plain = [message_start(), {"type": "ping"}, *text_block(0, "Hel", "lo"), *MESSAGE_END]
    batches = relay(sse(plain), MessagesStream())
    # message_start, the ping and the block's start wait for the first text: one batch
    assert [frame for event in batches[0] for frame in event.frames] == plain[:4]
    assert isinstance(batches[0][-1], TextDelta) and batches[0][-1].text == "Hel"
    assert [f for batch in batches for e in batch for f in e.frames] == plain
    # a thinking delta says something: it goes out as it comes
    batches = relay(sse(GOOD_MESSAGES), MessagesStream())
    assert [frame["type"] for event in batches[0] for frame in event.frames] == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
    ]
    assert batches[0][-1].frames[0]["delta"]["type"] == "thinking_delta"
    assert [f for batch in batches for e in batch for f in e.frames] == GOOD_MESSAGES


def test_the_relay_refuses_a_stream_cut_before_its_end() -> None:
    with pytest.raises(BadGateway, match="closed the stream before the answer was finished"):
        relay(sse(GOOD_MESSAGES[:-1]), MessagesStream())
    with pytest.raises(BadGateway, match="before message_start"):
        relay(sse(LLAMA_NO_MESSAGE_START), MessagesStream())


def test_a_stream_that_names_items_by_id_alone_gets_the_indexes_the_api_requires() -> None:
    reader = ResponsesStream()
    frames = llama_unindexed()
    events = read_all(reader, frames)
    assert reader.ended
    assert [e.text for e in events if isinstance(e, TextDelta)] == ["E", "j"]
    assert [frame["sequence_number"] for frame in frames] == list(range(len(frames)))
    assert all(frame["output_index"] == 0 for frame in frames[2:-1])
    assert all(frame["content_index"] == 0 for frame in frames[3:-2])
    # an id never added is no item
    stray = llama_unindexed()
    stray[4]["item_id"] = "msg_other"
    with pytest.raises(BadGateway, match="output item -1, which is not open"):
        read_all(ResponsesStream(), stray)
