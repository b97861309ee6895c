"""The deadline for a run of waits (an upstream answer's reads, the attempt's waits for the
backend's events): one timer for the whole run, DeadlinePassed when a wait outlasts it, and a
cancellation from elsewhere left a cancellation."""

from __future__ import annotations

import asyncio

import pytest

from gateway.core.deadline import Deadline, DeadlinePassed


async def after(seconds: float, value: bytes = b"piece") -> bytes:
    await asyncio.sleep(seconds)
    return value


def test_reads_within_the_deadline_share_one_timer():
    async def main() -> None:
        loop = asyncio.get_running_loop()
        deadline = Deadline(loop.time() + 5)
        assert await deadline.wait(after(0)) == b"piece"
        armed = deadline.handle
        for _ in range(100):
            assert await deadline.wait(after(0)) == b"piece"
        assert deadline.handle is armed  # not a timer made and cancelled per read
        deadline.close()
        assert armed is not None and armed.cancelled()

    asyncio.run(main())


def test_a_read_past_the_deadline_is_a_timeout():
    async def main() -> float:
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = Deadline(started + 0.1)
        with pytest.raises(DeadlinePassed):
            await deadline.wait(after(5))
        return loop.time() - started

    assert asyncio.run(main()) < 1


def test_a_deadline_moved_on_lets_a_read_go_on():
    """The first chunk's deadline, then the whole answer's: the timer armed for the first fires,
    finds the deadline moved, and waits for the new one."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        deadline = Deadline(loop.time() + 0.05)
        assert await deadline.wait(after(0)) == b"piece"
        deadline.when = loop.time() + 0.5
        assert await deadline.wait(after(0.2)) == b"piece"  # past the first deadline
        with pytest.raises(DeadlinePassed):
            await deadline.wait(after(5))

    asyncio.run(main())


def test_time_between_reads_fires_nothing():
    """The deadline passes while the answer's reader does something else (the client is slow):
    nothing is cancelled then; the next read finds the deadline passed."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        deadline = Deadline(loop.time() + 0.05)
        assert await deadline.wait(after(0)) == b"piece"
        await asyncio.sleep(0.1)  # not in a read: not cancelled
        with pytest.raises(DeadlinePassed):
            await deadline.wait(after(5))

    asyncio.run(main())


def test_a_cancellation_from_elsewhere_stays_a_cancellation():
    async def main() -> None:
        loop = asyncio.get_running_loop()
        deadline = Deadline(loop.time() + 5)
        reading = asyncio.create_task(deadline.wait(after(5)))
        await asyncio.sleep(0.01)
        reading.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reading

    asyncio.run(main())
