"""The connection's watch (gateway/core/disconnect.py): behind the gateway's edge, a request waiting on
its answer is stopped by the connection itself when the client leaves, with no task or timer of
its own; elsewhere a listener on `receive` hears it."""

from __future__ import annotations

import asyncio

import pytest

from gateway.core.disconnect import SCOPE_KEY, ClientWatch, unless_client_leaves
from gateway.core.errors import ClientGone
from gateway.telemetry.record import RequestRecord


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


def stream_scenario(with_watch: bool) -> tuple[list[dict], RequestRecord, list[str], int]:
    """A stream whose client leaves after its first chunk: the messages sent, the record, how
    its body ended, and the tasks alive while it was being sent."""
    from gateway.http.streaming import EventStreamResponse

    record = RequestRecord("id", "POST", "/v1/chat/completions")
    ended: list[str] = []
    sent: list[dict] = []
    watch = ClientWatch()
    gone = asyncio.Event()
    tasks_seen: list[int] = []

    async def body(write) -> None:
        try:
            await write(b"data: 1\n\n")  # a plain `send` underneath: each piece a message
            tasks_seen.append(len(asyncio.all_tasks()))
            await asyncio.sleep(60)  # a stalled upstream
            await write(b"data: 2\n\n")
        finally:
            ended.append("body closed")

    async def on_end() -> None:
        ended.append("ended")

    async def send(message: dict) -> None:
        sent.append(message)
        if message.get("body") == b"data: 1\n\n":
            asyncio.get_running_loop().call_later(0.05, watch.lost if with_watch else gone.set)

    async def receive() -> dict:
        await gone.wait()
        return {"type": "http.disconnect"}

    async def scenario() -> None:
        scope = {"type": "http", "extensions": {SCOPE_KEY: watch}} if with_watch else {"type": "http"}
        response = EventStreamResponse(body, "text/event-stream", [], record, on_end=on_end)
        async with asyncio.timeout(5):
            await response(scope, receive, send)

    asyncio.run(scenario())
    return sent, record, ended, tasks_seen[0]


@pytest.mark.parametrize("with_watch", [True, False])
def test_a_stream_whose_client_leaves_ends_at_once_and_says_so(with_watch: bool) -> None:
    sent, record, ended, tasks = stream_scenario(with_watch)
    assert [m.get("body") for m in sent] == [None, b"data: 1\n\n"]
    assert record.error_code == ClientGone.code
    assert ended == ["body closed", "ended"]
    # behind the edge the stream is sent by the request's task alone; elsewhere a listener too
    assert tasks == (1 if with_watch else 2)
