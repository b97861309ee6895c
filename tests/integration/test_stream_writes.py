"""How many writes a stream relayed at a model's pace costs behind the edge: each chunk goes out
at once in a write of its own (gateway/server/edge_writing.py, `write_through`), and the
answer's end (its usage, the done line, the body's last chunk) in one write
(gateway/chat.py: the last piece, `last`; backends/openai_compatible.py: the read that ends the
stream brings its end). The whole app, in process, in front of an upstream on loopback that
sends each chunk 20 ms after the one before."""

from __future__ import annotations

import asyncio

import orjson

from gateway.config.settings import Settings
from tests.support.edge_cycle import dechunked, served
from tests.support.fault_upstream import FaultUpstream


def test_at_a_models_pace_each_chunk_is_a_write_and_the_end_is_one():
    with FaultUpstream() as upstream:
        settings = Settings.model_validate(
            {
                "deployments": [
                    {
                        "name": "paced",
                        "backend": "openai-compatible",
                        "models": ["*"],
                        "options": {"base_url": upstream.base_url("drip-20")},
                    }
                ]
            }
        )
        body = orjson.dumps(
            {
                "model": "paced",
                "stream": True,
                "stream_options": {"include_usage": True},
                "messages": [{"role": "user", "content": "hello"}],
            }
        )
        _, written = asyncio.run(served(settings, "/v1/chat/completions", body))
    head, _, first = written.writes[0].partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    events = [dechunked(write + b"0\r\n\r\n").split(b"\n\n")[:-1] for write in [first, *written.writes[1:-1]]]
    # the head and the first chunk (the role's and the first text's) in one write; then a
    # write a chunk
    assert [len(chunks) for chunks in events] == [2, 1, 1], written.writes
    said = [
        [orjson.loads(chunk.removeprefix(b"data: "))["choices"][0] for chunk in chunks] for chunks in events
    ]
    assert said[0][0]["delta"]["role"] == "assistant"
    assert [said[0][1]["delta"]["content"], said[1][0]["delta"]["content"]] == ["fine", " answer"]
    assert said[2][0]["finish_reason"] == "stop"
    # the usage, the done line and the body's end: one write
    end = dechunked(written.writes[-1]).split(b"\n\n")
    assert end[-2:] == [b"data: [DONE]", b""]
    assert [orjson.loads(chunk.removeprefix(b"data: "))["usage"]["total_tokens"] for chunk in end[:-2]] == [5]
