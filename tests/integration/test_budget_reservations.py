"""Budget reservations held in a real Redis while their requests run: released (never below zero)
when the store lost them, renewed while a long stream runs, and let run out when the gateway that
held them was killed. Streams are held open by an upstream that goes silent after one chunk."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from contextlib import ExitStack

import httpx
import pytest
import redis

from gateway.core.token_count import estimate
from gateway.policy.auth import new_key
from tests.support.fault_upstream import FaultUpstream
from tests.support.gateway_process import gateway_process
from tests.support.redis_server import running_redis

pytestmark = pytest.mark.slow  # out of the fast lane (docs/development/tests.md)

KEY, KEY_SHA = new_key()
AUTH = {"authorization": f"Bearer {KEY}"}
USER = [{"role": "user", "content": "hold this for me"}]
PER_REQUEST = estimate(USER)  # what admission reserves: the prompt's estimate
FITS = 3  # requests whose reservations fit the budget at once
# what a stream hung up on after its first chunk ("fine") is charged: its prompt and that word
HUNG_UP = PER_REQUEST + 1


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory) -> Iterator[str]:
    with running_redis(tmp_path_factory.mktemp("redis")) as (url, _process):
        yield url


@pytest.fixture(scope="module")
def upstream() -> Iterator[FaultUpstream]:
    with FaultUpstream() as server:
        yield server


def settings(redis_url: str, upstream: FaultUpstream, lease: float | None = None) -> dict:
    never_eject = {"failures": 1000}
    config: dict = {
        "keys": [
            {"name": "holder", "sha256": KEY_SHA, "budgets": [{"tokens": FITS * PER_REQUEST, "per": "day"}]}
        ],
        "deployments": [
            {"name": "silent", "backend": "openai-compatible", "health": never_eject,
             "replicas": [{"options": {"base_url": upstream.base_url("stall-mid")}}],
             "timeouts": {"idle": 120, "total": 600}},
            {"name": "ok", "backend": "openai-compatible", "health": never_eject,
             "replicas": [{"options": {"base_url": upstream.base_url("ok")}}]},
        ],
        "rate_limits": {"store": "redis", "redis": {"url": redis_url}},
    }  # fmt: skip
    if lease is not None:
        config["rate_limits"]["redis"]["reservation_lease"] = lease
    return config


def open_stream(streams: ExitStack, url: str) -> int:
    """Start a stream on the silent deployment and hold it open: its status (200 once its first
    chunk came, or the refusal's)."""
    body = {"model": "silent", "messages": USER, "stream": True}
    response = streams.enter_context(
        httpx.stream("POST", f"{url}/v1/chat/completions", json=body, headers=AUTH, timeout=60)
    )
    if response.status_code == 200:
        lines = response.iter_lines()
        streams.callback(lines.close)  # held: an iterator dropped early hangs up
        while '"fine"' not in next(lines):
            pass
    return response.status_code


def one_answer(url: str) -> httpx.Response:
    body = {"model": "ok", "messages": USER}
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers=AUTH, timeout=60)


def account(store: redis.Redis) -> tuple[float, float]:
    """The key's budget account in the store: (spent, held)."""
    names = list(store.scan_iter(match="*budget*:account"))
    assert len(names) == 1, names
    spent, held = store.hmget(names[0], "spent", "held")
    return float(spent or 0), float(held or 0)


def wait_until(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_a_store_flushed_with_streams_in_flight_never_goes_below_zero(tmp_path, redis_url, upstream):
    """Regression (issue 24, item 11): the refunds of requests whose reservations a FLUSHALL had
    wiped took the account below zero (−7,536 in the attack), and the key could then spend its
    budget again on top. A settlement now releases only what the store still holds, and adds
    what the hung-up streams were relayed (issue 28): the budget stays used up."""
    store = redis.Redis.from_url(redis_url)
    store.flushall()
    with gateway_process(tmp_path, settings(redis_url, upstream)) as gateway:
        with ExitStack() as streams:
            assert [open_stream(streams, gateway.url) for _ in range(FITS + 1)] == [200] * FITS + [429]
            store.flushall()
        # the client hung up on every stream: the gateway hangs up upstream, then settles
        assert wait_until(lambda: upstream.answering["stall-mid"] == 0, 30)
        assert wait_until(lambda: account(store) == (FITS * HUNG_UP, 0.0), 30), account(store)
        with ExitStack() as streams:
            statuses = [open_stream(streams, gateway.url) for _ in range(FITS + 1)]
        assert statuses == [429] * (FITS + 1), statuses
    for name in store.scan_iter(match="*budget*:account"):
        assert float(store.hget(name, "spent") or 0) >= 0 and float(store.hget(name, "held") or 0) >= 0


def test_a_killed_gateways_reservations_stop_counting_after_their_lease(tmp_path, redis_url, upstream):
    """Regression (issue 24, item 11): `kill -9` with streams in flight left their reservations
    in the store until the budget's period ended. Now each is a lease its gateway renews: the
    other gateway sees them while they live, and admits again once they ran out."""
    lease = 3.0
    redis.Redis.from_url(redis_url).flushall()
    config = settings(redis_url, upstream, lease)
    with (
        gateway_process(tmp_path, config) as doomed,
        gateway_process(tmp_path, config) as survivor,
        ExitStack() as streams,
    ):
        assert [open_stream(streams, doomed.url) for _ in range(FITS)] == [200] * FITS
        time.sleep(2 * lease)  # renewed by the gateway holding them: still counted elsewhere
        refused = one_answer(survivor.url)
        assert refused.status_code == 429 and "budget" in refused.text
        doomed.signal(signal.SIGKILL)
        doomed.wait(10)
        killed_at = time.monotonic()
        admitted = wait_until(lambda: one_answer(survivor.url).status_code == 200, 60)
        waited = time.monotonic() - killed_at
    assert admitted, "the killed gateway's reservations still count a minute later"
    assert waited < lease + 20, waited  # the lease, and a loaded machine's slack


def test_a_stream_longer_than_the_lease_keeps_its_reservation_and_a_hang_up_settles_it(
    tmp_path, redis_url, upstream
):
    """A lease is renewed every third of it while its request runs: streams held open for
    several leases still hold the budget; their hang-up settles it at once, to what each was
    relayed (its prompt and its one word)."""
    lease = 2.0
    store = redis.Redis.from_url(redis_url)
    store.flushall()
    with gateway_process(tmp_path, settings(redis_url, upstream, lease)) as gateway:
        with ExitStack() as streams:
            assert [open_stream(streams, gateway.url) for _ in range(FITS)] == [200] * FITS
            time.sleep(3 * lease)
            assert one_answer(gateway.url).status_code == 429
        # settled at the hang-up: nothing waits for a lease to run out (the gateway renews them)
        assert wait_until(lambda: upstream.answering["stall-mid"] == 0, 30)
        assert wait_until(lambda: account(store) == (FITS * HUNG_UP, 0.0), 30), account(store)
