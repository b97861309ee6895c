"""The wait queue's fairness between keys, in one event loop."""

from __future__ import annotations

import asyncio

import pytest

from gateway.fleet.wait_queue import QueueFull, WaitQueue


def test_a_queue_of_no_places_refuses_at_once() -> None:
    async def scenario() -> None:
        queue = WaitQueue(0, 5)
        with pytest.raises(QueueFull):
            await queue.wait(asyncio.get_running_loop().time() + 1, key="a")

    asyncio.run(scenario())


def test_a_full_queue_takes_another_keys_request_in_the_biggest_holders_newest_place() -> None:
    async def scenario() -> None:
        queue = WaitQueue(3, 5)
        until = asyncio.get_running_loop().time() + 5
        a = [asyncio.create_task(queue.wait(until, key="a")) for _ in range(3)]
        await asyncio.sleep(0)
        with pytest.raises(QueueFull):  # a's fourth: a holds every place already
            await queue.wait(until, key="a")
        b = asyncio.create_task(queue.wait(until, key="b"))
        (displaced,) = await asyncio.gather(a[2], return_exceptions=True)
        assert isinstance(displaced, QueueFull)
        assert len(queue) == 3
        queue.running["a"] = 2  # a holds two slots, b none: the freed slot is b's
        queue.wake()
        await asyncio.wait_for(b, 1)  # b's turn
        assert not a[0].done()
        queue.wake()
        await asyncio.wait_for(a[0], 1)
        a[1].cancel()
        await asyncio.gather(a[1], return_exceptions=True)
        assert len(queue) == 0

    asyncio.run(scenario())
