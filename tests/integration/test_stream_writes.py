"""How many writes a stream relayed at a model's pace costs behind the edge: each chunk goes out
at once in a write of its own (gateway/server/edge_writing.py, `write_through`), and the
answer's end (its usage, the done line, the body's last chunk) in one write
(gateway/chat.py: the last piece, `last`; backends/openai_compatible.py: the read that ends the
stream brings its end). The whole app, in process, in front of an upstream on loopback that
sends each chunk 20 ms after the one before."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from gateway.config.settings import Settings
from gateway.core.turns import LoopTurns
from tests.support.edge_cycle import dechunked, served
from tests.support.fault_upstream import FaultUpstream


def relayed(behaviour: str) -> list[bytes]:
    """The writes of a streamed chat completion relayed from the fault upstream's `behaviour`."""
    with FaultUpstream() as upstream:
        settings = Settings.model_validate(
            {
                "deployments": [
                    {
                        "name": "paced",
                        "backend": "openai-compatible",
                        "models": ["*"],
                        "options": {"base_url": upstream.base_url(behaviour)},
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
    return written.writes


def the_end_is_one_write(writes: list[bytes]) -> None:
    """The last write holds the usage, the done line and the body's end (and the head, when the
    whole answer came at once)."""
    last = writes[-1].partition(b"\r\n\r\n")[2] if writes[-1].startswith(b"HTTP/1.1") else writes[-1]
    end = dechunked(last).split(b"\n\n")
    assert end[-2:] == [b"data: [DONE]", b""], writes
    assert orjson.loads(end[-3].removeprefix(b"data: "))["usage"]["total_tokens"] == 5


def test_at_a_models_pace_each_chunk_is_a_write_and_the_end_is_one():
    writes = relayed("drip-20")
    head, _, first = writes[0].partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    events = [dechunked(write + b"0\r\n\r\n").split(b"\n\n")[:-1] for write in [first, *writes[1:-1]]]
    # the head and the first chunk (the role's and the first text's) in one write; then a
    # write a chunk
    assert [len(chunks) for chunks in events] == [2, 1, 1], writes
    said = [
        [orjson.loads(chunk.removeprefix(b"data: "))["choices"][0] for chunk in chunks] for chunks in events
    ]
    assert said[0][0]["delta"]["role"] == "assistant"
    assert [said[0][1]["delta"]["content"], said[1][0]["delta"]["content"]] == ["fine", " answer"]
    assert said[2][0]["finish_reason"] == "stop"
    the_end_is_one_write(writes)


def test_the_end_is_one_write_when_the_upstreams_last_bytes_come_late():
    """The upstream's body ends 50 ms after its done line: the gateway reads that end (to reuse
    the connection) before passing the answer's end on, so the client's usage, done line and
    body's end still leave together, in the last write (with the rest, when the whole answer was
    read at once)."""
    writes = relayed("late-end")
    the_end_is_one_write(writes)
    assert b"[DONE]" not in b"".join(writes[:-1])


def test_at_a_models_pace_no_chunk_asks_the_loop_for_a_callback(monkeypatch: pytest.MonkeyPatch):
    """Each chunk's upstream read waited and says so (gateway/core/turns.py), so neither the
    relay (gateway/fleet/dispatch.py) nor the edge asks for a callback to learn that the loop
    has turned: the answer asks once, as it starts, however many chunks it relays."""
    asked = []
    ask = LoopTurns.ask

    def counted(turns: LoopTurns) -> int:
        asked.append(turns.count)
        return ask(turns)

    monkeypatch.setattr(LoopTurns, "ask", counted)
    writes = relayed("drip-20")
    assert len(writes) == 4, writes  # three chunks 20 ms apart, and the end
    assert len(asked) == 1, asked
