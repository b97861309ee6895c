"""The connection's watch (gateway/disconnect.py): behind the gateway's edge, a request waiting on
its answer is stopped by the connection itself when the client leaves, with no task or timer of
its own; elsewhere a listener on `receive` hears it."""

from __future__ import annotations

import asyncio

import pytest

from gateway.core.errors import ClientGone
from gateway.disconnect import ClientWatch, unless_client_leaves


async def never_receive() -> dict:
    await asyncio.Event().wait()
    return {}


def test_a_lost_connection_stops_the_work_at_once_and_makes_no_task() -> None:
    async def scenario() -> None:
        watch = ClientWatch()
        work_cancelled = asyncio.Event()

        async def work() -> str:
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                work_cancelled.set()
                raise
            return "answer"

        waiting = asyncio.ensure_future(unless_client_leaves(work(), never_receive, watch))
        await asyncio.sleep(0.1)  # past the listener's 50 ms: the watch makes none
        assert len(asyncio.all_tasks()) == 2  # this one and the request's
        assert watch.task is waiting
        loop = asyncio.get_running_loop()
        lost_at = loop.time()
        watch.lost()
        with pytest.raises(ClientGone):
            await waiting
        assert loop.time() - lost_at < 0.05
        assert work_cancelled.is_set()
        assert watch.task is None

    asyncio.run(scenario())


def test_the_watch_is_free_again_after_an_answer_and_refuses_once_gone() -> None:
    async def scenario() -> None:
        watch = ClientWatch()

        async def answer() -> str:
            return "answer"

        assert await unless_client_leaves(answer(), never_receive, watch) == "answer"
        assert watch.task is None
        watch.lost()  # a later loss cancels nothing
        with pytest.raises(ClientGone):
            await unless_client_leaves(answer(), never_receive, watch)

    asyncio.run(scenario())


def test_another_cancellation_is_not_taken_for_the_client_leaving() -> None:
    async def scenario() -> None:
        watch = ClientWatch()
        waiting = asyncio.ensure_future(unless_client_leaves(asyncio.sleep(60), never_receive, watch))
        await asyncio.sleep(0)
        waiting.cancel()  # a shutdown, say
        with pytest.raises(asyncio.CancelledError):
            await waiting

    asyncio.run(scenario())


def test_without_a_watch_a_listener_hears_the_disconnect() -> None:
    async def scenario() -> None:
        gone = asyncio.Event()

        async def receive() -> dict:
            await gone.wait()
            return {"type": "http.disconnect"}

        waiting = asyncio.ensure_future(unless_client_leaves(asyncio.sleep(60), receive))
        await asyncio.sleep(0.1)
        gone.set()
        with pytest.raises(ClientGone):
            await waiting

    asyncio.run(scenario())
