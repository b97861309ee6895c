"""Many slow streams at once, as an engine's clients send them: a real `chatgate serve`, a real
upstream on loopback that drips its chunks, hundreds of concurrent clients.

A replica takes `concurrency.max_concurrent` requests at once; the rest wait in the deployment's
queue and are served as slots free, never failed by the connection pool's own wait (finding 7:
the pool of 100 connections failed a request that waited longer than `connect` for one). Past
the queue's length or its timeout: a 503 with Retry-After, in the dialect's shape, before any
byte of a 200."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import orjson
import pytest
import yaml

from tests.support.fault_upstream import FaultUpstream
from tests.support.servers import running_gateway

pytestmark = pytest.mark.slow  # out of the fast lane (docs/development/tests.md)

OPENAI = "/v1/chat/completions"
AZURE = "/azure/chat/completions?api-version=2024-05-01-preview"
USER = [{"role": "user", "content": "hello"}]


class PeakUpstream(FaultUpstream):
    """The fault upstream, counting the most requests each behaviour answered at once."""

    def __init__(self) -> None:
        super().__init__()
        self.peak: Counter[str] = Counter()

    async def answer(self, behaviour: str, stream: bool, reader: Any, writer: Any) -> bool:
        self.peak[behaviour] = max(self.peak[behaviour], self.answering[behaviour])
        return await super().answer(behaviour, stream, reader, writer)


def deployment(name: str, base_url: str, **settings: Any) -> dict[str, Any]:
    return {"name": name, "backend": "openai-compatible", "options": {"base_url": base_url}, **settings}


@pytest.fixture(scope="module")
def upstream() -> Iterator[PeakUpstream]:
    with PeakUpstream() as server:
        yield server


@pytest.fixture(scope="module")
def gateway(upstream: PeakUpstream, tmp_path_factory, log_dir: Path) -> Iterator[str]:
    u = upstream.base_url
    deployments = [
        # the defaults, with a short connect timeout (a4f111b failed a request after 3 waits of
        # `connect` for one of its 100 pooled connections; its streams last longer than that)
        {**deployment("defaults", u("drip-600")), "options": {"base_url": u("drip-600"), "connect": 0.5}},
        # a pool set smaller than the admission limit: the limit follows it, the rest queue
        {
            **deployment("small-pool", u("drip-300")),
            "options": {"base_url": u("drip-300"), "connect": 0.2, "max_connections": 2},
        },
        deployment("capped", u("drip-200"), concurrency={"max_concurrent": 200, "queue": 1000}),
        # one slot (held 6 s), one place in the queue, a short wait; keep-alives every 0.2 s
        deployment(
            "tight",
            u("drip-1200"),
            concurrency={"max_concurrent": 1, "queue": 1, "queue_timeout": 2.0},
            timeouts={"keepalive": 0.2},
        ),
        deployment(
            "leave",
            u("drip-800"),
            concurrency={"max_concurrent": 1, "queue": 1, "queue_timeout": 30},
            timeouts={"keepalive": 0.2},
        ),
    ]
    config = tmp_path_factory.mktemp("concurrency") / "config.yaml"
    config.write_text(yaml.safe_dump({"deployments": deployments}))
    with running_gateway(log_dir, config) as url:
        yield url


async def one_stream(session: aiohttp.ClientSession, url: str, model: str) -> str:
    """'ok' for a whole stream (200, ended with [DONE]), else what went wrong."""
    body = {"model": model, "messages": USER, "stream": True}
    try:
        async with session.post(url, json=body) as response:
            text = await response.text()
    except (aiohttp.ClientError, TimeoutError) as error:
        return f"{type(error).__name__}: {error}"
    if response.status != 200:
        return f"{response.status}: {text[:200]}"
    if not text.rstrip().endswith("data: [DONE]") or '"error"' in text:
        return f"200, broken: {text[-200:]}"
    return "ok"


def streams_at_once(gateway: str, model: str, count: int) -> Counter[str]:
    async def run() -> Counter[str]:
        connector = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=120)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            streams = (one_stream(session, gateway + OPENAI, model) for _ in range(count))
            found = await asyncio.gather(*streams)
        return Counter(found)

    return asyncio.run(run())


def test_300_slow_streams_with_the_default_limits_all_finish(gateway, upstream):
    """Finding 7: on a4f111b, 200 of these waited for a pooled connection and failed (503
    UpstreamBusy after three waits of `connect`); now 256 run at once and the rest queue."""
    outcomes = streams_at_once(gateway, "defaults", 300)
    assert outcomes == Counter({"ok": 300}), outcomes.most_common(3)
    assert upstream.peak["drip-600"] <= 256


def test_a_pool_smaller_than_the_limit_lowers_the_limit_instead_of_failing_requests(gateway, upstream):
    outcomes = streams_at_once(gateway, "small-pool", 8)
    assert outcomes == Counter({"ok": 8}), outcomes.most_common(3)
    assert upstream.peak["drip-300"] == 2


def test_600_streams_through_200_slots_all_finish_and_never_more_than_200_at_once(gateway, upstream):
    outcomes = streams_at_once(gateway, "capped", 600)
    assert outcomes == Counter({"ok": 600}), outcomes.most_common(3)
    assert upstream.counts["drip-200"] == 600
    assert 100 < upstream.peak["drip-200"] <= 200


def hold(gateway: str, model: str) -> threading.Thread:
    """A stream that takes the deployment's only slot (started, and seen upstream, on return)."""

    def run() -> None:
        response = httpx.post(
            gateway + OPENAI, json={"model": model, "messages": USER, "stream": True}, timeout=60
        )
        assert response.status_code == 200

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def wait_for(condition: Any, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.02)


def queued(gateway: str, deployment: str) -> float:
    line = f'chatgate_requests_queued{{deployment="{deployment}"}} '
    for found in httpx.get(gateway + "/metrics").text.splitlines():
        if found.startswith(line):
            return float(found.removeprefix(line))
    return 0.0


def message_and_code(dialect: str, response: httpx.Response) -> tuple[str, str]:
    body = response.json()
    if dialect == "openai":
        return body["error"]["message"], body["error"]["code"]
    return body["message"], response.headers["x-ms-error-code"]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("dialect", ["openai", "azure"])
def test_past_the_queue_a_503_with_retry_after_before_any_byte(gateway, upstream, dialect, stream):
    """One slot taken; the next request waits its 2 s and gets a 503 (a stream gets no 200 nor a
    keep-alive first, though its keep-alive comes every 0.2 s); one more while it waits finds
    the queue full and gets its 503 at once."""
    answered = upstream.counts["drip-1200"]
    holder = hold(gateway, "tight")
    wait_for(lambda: upstream.counts["drip-1200"] == answered + 1)
    url = gateway + (OPENAI if dialect == "openai" else AZURE)
    body = {"model": "tight", "messages": USER, "stream": stream}
    results: dict[str, httpx.Response] = {}

    def waiting() -> None:
        results["waited"] = httpx.post(url, json=body, timeout=30)

    waiter = threading.Thread(target=waiting)
    waiter.start()
    wait_for(lambda: queued(gateway, "tight") == 1)  # (its wait lasts 2 s)
    full = httpx.post(url, json=body, timeout=30)
    waiter.join(30)
    waited = results["waited"]
    for response, code in ((full, "QueueFull"), (waited, "QueueTimeout")):
        assert response.status_code == 503, response.text
        assert response.headers["content-type"].startswith("application/json")
        assert int(response.headers["retry-after"]) >= 1
        message, found_code = message_and_code(dialect, response)
        assert found_code == code
        assert "try again later" in message and "tight" in message
    assert upstream.counts["drip-1200"] == answered + 1  # neither reached the upstream
    holder.join(30)


def test_a_client_that_leaves_the_queue_frees_its_place(gateway, upstream):
    """The only place in the queue is taken by a client that then goes away: the next request
    gets the place (not a 503 QueueFull), and the one that left never reaches the upstream."""
    answered = upstream.counts["drip-800"]
    holder = hold(gateway, "leave")
    wait_for(lambda: upstream.counts["drip-800"] == answered + 1)
    body = {"model": "leave", "messages": USER, "stream": True}
    raw = orjson.dumps(body)
    host, port = gateway.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as client:
        client.sendall(
            f"POST {OPENAI} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(raw)}\r\n\r\n".encode()
            + raw
        )
        wait_for(lambda: queued(gateway, "leave") == 1)
        client.settimeout(0.5)
        with pytest.raises(TimeoutError):  # no byte while it waits (no keep-alive either)
            client.recv(1)
    wait_for(lambda: queued(gateway, "leave") == 0)
    response = httpx.post(gateway + OPENAI, json=body, timeout=30)
    assert response.status_code == 200 and response.text.rstrip().endswith("data: [DONE]")
    holder.join(30)
    assert upstream.counts["drip-800"] == answered + 2  # the holder and the last one
