"""backends.http.stream_decoders: an upstream's stream, in whatever pieces it arrives, → its payloads."""

from __future__ import annotations

import orjson
import pytest

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
