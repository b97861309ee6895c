"""A relay gives the event loop a turn when it has not waited for one (a backend with its events
ready), and gives none it does not need (a backend that waits for each event, a model's pace):
gateway/core/turns.py, gateway/fleet/dispatch.py."""

from __future__ import annotations

import asyncio
import time
import types
from collections.abc import AsyncIterator

import pytest

from gateway.config.settings import Settings
from gateway.core.canonical import ChatRequest, Finish, Item, TextDelta, Usage
from gateway.core.turns import LoopTurns, turns_of
from gateway.fleet import dispatch
from gateway.runtime import Runtime
from gateway.telemetry.record import RequestRecord

EVENTS = 40


def test_the_count_moves_only_once_the_task_that_asked_lets_the_loop_run():
    async def main() -> None:
        turns = LoopTurns(asyncio.get_running_loop())
        seen = turns.ask()
        for _ in range(1000):  # asking again in the same turn adds no callback
            assert turns.ask() == seen
        time.sleep(0.01)  # busy, not waiting: the loop has had no turn
        assert turns.count == seen
        await asyncio.sleep(0)
        assert turns.count == seen + 1
        assert not turns.pending
        await asyncio.sleep(0)
        assert turns.count == seen + 1  # counted only while asked

    asyncio.run(main())


def test_a_task_back_from_a_wait_counts_the_turn_with_no_callback():
    async def main() -> None:
        turns = LoopTurns(asyncio.get_running_loop())
        seen = turns.count
        turns.waited()  # an upstream's read that found nothing yet, back with bytes
        assert turns.count == seen + 1
        assert not turns.pending
        await asyncio.sleep(0)
        assert turns.count == seen + 1  # and nothing was left for the loop to run

    asyncio.run(main())


class Paced:
    """A backend whose events come `wait` seconds apart: waited for (a model's pace), or
    computed without letting the loop run (`busy`: a backend with its events ready)."""

    def __init__(self, wait: float, busy: bool) -> None:
        self.wait, self.busy = wait, busy

    async def generate(self, request: ChatRequest) -> AsyncIterator[Item]:
        for _ in range(EVENTS):
            if self.busy:
                time.sleep(self.wait)
            else:
                await asyncio.sleep(self.wait)
            yield TextDelta(0, "word ", None)
        yield [Finish(0, "stop"), Usage(1, EVENTS)]


def relayed(monkeypatch: pytest.MonkeyPatch, backend: Paced) -> tuple[int, int, float]:
    """The items the dispatcher relayed, the turns it gave (its `sleep(0)`s) and the longest the
    loop went without running another task, while it relayed `backend`'s answer."""
    given = []

    async def counted_sleep(delay: float, result: object = None) -> object:
        given.append(delay)
        return await asyncio.sleep(delay, result)

    monkeypatch.setattr(
        dispatch, "asyncio", types.SimpleNamespace(**{**vars(asyncio), "sleep": counted_sleep})
    )
    deployment = {
        "name": "paced",
        "backend": "openai-compatible",
        "options": {"base_url": "http://127.0.0.1:9"},
    }
    runtime = Runtime(Settings.model_validate({"deployments": [deployment]}))
    routed = runtime.router.deployments["paced"]
    routed.replicas[0].backend = backend  # type: ignore[assignment]
    request = ChatRequest(model="paced", messages=[{"role": "user", "content": "hi"}], stream=True)

    async def main() -> tuple[int, float]:
        loop = asyncio.get_running_loop()
        gaps: list[float] = []

        async def ticker() -> None:
            last = loop.time()
            while True:
                await asyncio.sleep(0)
                now = loop.time()
                gaps.append(now - last)
                last = now

        ticking = asyncio.ensure_future(ticker())
        await asyncio.sleep(0)
        record = RequestRecord("id", "POST", "/v1/chat/completions")
        items = [item async for item in runtime.dispatcher.events(routed, request, record)]
        ticking.cancel()
        return len(items), max(gaps)

    count, longest = asyncio.run(main())
    return count, given.count(0), longest


def test_a_relay_at_a_models_pace_gives_no_turn_it_does_not_need(monkeypatch: pytest.MonkeyPatch):
    count, given, _ = relayed(monkeypatch, Paced(2 * dispatch.TURN_SECONDS, busy=False))
    assert count == EVENTS + 1
    assert given == 0


def test_a_relay_that_never_waits_gives_the_loop_turns(monkeypatch: pytest.MonkeyPatch):
    count, given, longest = relayed(monkeypatch, Paced(0.001, busy=True))
    assert count == EVENTS + 1
    assert given >= 3  # 40 ms without a wait: a turn at least every 10 ms
    assert longest < 2 * dispatch.TURN_SECONDS + 0.004


def test_every_asker_on_a_loop_shares_its_turns_and_another_loop_gets_its_own():
    async def asked() -> tuple[LoopTurns, LoopTurns]:
        loop = asyncio.get_running_loop()
        return turns_of(loop), turns_of(loop)

    first, again = asyncio.run(asked())
    assert first is again  # one callback a turn for the dispatcher and the edge together
    other, _ = asyncio.run(asked())
    assert other is not first and other.loop is not first.loop
