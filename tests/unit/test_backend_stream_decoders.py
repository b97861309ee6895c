"""backends.http.stream_decoders: an upstream's stream, in whatever pieces it arrives, → its payloads."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from backends.http.stream_decoders import JSONLinesDecoder, SSEDecoder, decoder_for

SSE = (
    b': keep-alive\n\ndata: {"a": 1}\r\n\r\nevent: x\ndata:{"b": 2}\n\n'
    b'data: {"c":\ndata: 3}\n\ndata: [DONE]\n\ndata: {"late": 1}\n\n'
)
JSON_LINES = b'{"a": 1}\r\n\n{"b": 2}\n   \n{"c": 3}'  # blank lines, CRLF, no final newline


def decoded(decoder: SSEDecoder | JSONLinesDecoder, stream: bytes, size: int) -> list[object]:
    payloads = []
    for start in range(0, len(stream), size):
        payloads += decoder.feed(stream[start : start + size])
    payloads += decoder.close()
    return [orjson.loads(p) for p in payloads]


@pytest.mark.parametrize("size", [1, 2, 3, 7, len(SSE)])
def test_sse_survives_any_split(size: int) -> None:
    decoder = SSEDecoder()
    assert decoded(decoder, SSE, size) == [{"a": 1}, {"b": 2}, {"c": 3}]
    assert decoder.done


@pytest.mark.parametrize("size", [1, 2, 5, len(JSON_LINES)])
def test_json_lines_survive_any_split(size: int) -> None:
    decoder = JSONLinesDecoder()
    assert decoded(decoder, JSON_LINES, size) == [{"a": 1}, {"b": 2}, {"c": 3}]
    assert not decoder.done  # JSON lines end with the body, not with a marker


def test_a_large_event_in_many_pieces_is_assembled_once() -> None:
    event = b"data: " + orjson.dumps({"text": "x" * 4_000_000}) + b"\n\n"
    decoder = SSEDecoder()
    payloads = []
    for start in range(0, len(event), 1024):  # 4,000 pieces: linear, not quadratic, in the size
        payloads += decoder.feed(event[start : start + 1024])
    assert [len(orjson.loads(p)["text"]) for p in payloads] == [4_000_000]


@pytest.mark.parametrize(
    ("media_type", "decoder"),
    [
        ("text/event-stream", SSEDecoder),
        ("application/jsonlines", JSONLinesDecoder),  # LMI
        ("application/x-ndjson", JSONLinesDecoder),
        ("application/json", None),
        ("", None),
    ],
)
def test_the_content_type_picks_the_decoder(media_type: str, decoder: type | None) -> None:
    found = decoder_for(media_type)
    assert (type(found) if found is not None else None) is decoder


def reference_sse(stream: bytes) -> list[bytes]:
    """The payloads of a whole stream, by the event stream's own rules, written plainly: the
    fast path for one-line events must give the same."""
    payloads = []
    text = stream.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    for event in text.split(b"\n\n")[:-1]:  # what follows the last blank line is unfinished
        lines = [line for line in event.split(b"\n") if line.startswith(b"data:")]
        if not lines:
            continue
        value = b"\n".join(line[6:] if line[5:6] == b" " else line[5:] for line in lines)
        if value == b"[DONE]":
            break
        payloads.append(value)
    return payloads


EVENTS = st.sampled_from(
    [b'data: {"a": 1}\n\n', b'data:{"b": 2}\n\n', b"data:\n\n", b"data: \n\n", b"data: [DONE]\n\n",
     b"data:[DONE]\n\n", b": ping\n\n", b'event: x\ndata: {"c": 3}\n\n', b'data: {"d":\ndata: 4}\n\n',
     b'data: {"e": 5}\r\n\r\n', b"id: 7\n\n", b'data: {"f": "\\n"}\n\n', b"\n\n"]
)  # fmt: skip


@given(st.lists(EVENTS, max_size=12), st.lists(st.integers(1, 40), min_size=1, max_size=12))
def test_sse_pieces_give_what_the_whole_stream_gives(events: list[bytes], sizes: list[int]) -> None:
    stream = b"".join(events)
    decoder = SSEDecoder()
    payloads: list[bytes] = []
    start, turn = 0, 0
    while start < len(stream):  # pieces of the sizes drawn, in turn: an event whole, split, or joined
        size = sizes[turn % len(sizes)]
        payloads += decoder.feed(stream[start : start + size])
        start, turn = start + size, turn + 1
    payloads += decoder.close()
    assert payloads == reference_sse(stream + b"\n\n")
    for event in events:  # and each event as a piece of its own, as a model's pace sends them
        one = SSEDecoder()
        assert list(one.feed(event)) + list(one.close()) == reference_sse(event + b"\n\n")
