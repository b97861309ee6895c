"""Fault injection against real sockets on loopback: failover, retries, timeouts, keep-alive,
circuit breaking, load balancing, metrics — asserted as the OpenAI and Azure clients see them."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml

from tests.support.fault_upstream import FaultUpstream
from tests.support.servers import free_port, running_gateway

pytestmark = pytest.mark.slow  # out of the fast lane (docs/development/tests.md)

DIALECTS = ["openai", "azure"]
URLS = {
    "openai": "/v1/chat/completions",
    "azure": "/azure/chat/completions?api-version=2024-05-01-preview",
    "lmi": "/lmi/v1/chat/completions",  # streams JSON lines: no keep-alive comments while it waits
}
USER = [{"role": "user", "content": "hello"}]


def replicas(*urls: str) -> list[dict[str, Any]]:
    return [{"name": f"r{i}", "options": {"base_url": url}} for i, url in enumerate(urls)]


def deployment(name: str, urls: list[str], **settings: Any) -> dict[str, Any]:
    return {"name": name, "backend": "openai-compatible", "replicas": replicas(*urls), **settings}


PHOENIX_PORT = free_port()


@pytest.fixture(scope="module")
def upstream() -> Iterator[FaultUpstream]:
    with FaultUpstream() as server:
        yield server


@pytest.fixture(scope="module")
def gateway(upstream: FaultUpstream, tmp_path_factory, log_dir: Path) -> Iterator[str]:
    closed = f"http://127.0.0.1:{free_port()}/v1"
    u = upstream.base_url
    never_eject = {"failures": 1000}
    deployments = [
        deployment("failover", [closed, u("ok")], health={"failures": 1, "cooldown": 600}),
        deployment("refused", [closed], health=never_eject),
        deployment("reset", [u("reset")], health=never_eject, retries={"attempts": 1}),
        deployment("stall", [u("stall")], health=never_eject, retries={"attempts": 1},
                   timeouts={"first_token": 1.5, "headers": 0.3, "keepalive": 0.3}),
        # the 200 held until the first token (default hold, 10 s): a failure before it is a status
        deployment("stall-held", [u("stall")], health=never_eject, retries={"attempts": 1},
                   timeouts={"first_token": 1.5}),
        deployment("stall-long", [u("stall")], health=never_eject, retries={"attempts": 1}),
        deployment("role-then-reset", [u("role-then-reset")], health=never_eject, retries={"attempts": 1}),
        deployment("stall-mid", [u("stall-mid")], health=never_eject, timeouts={"idle": 1.0}),
        deployment("stall-mid-long", [u("stall-mid")], health=never_eject, timeouts={"idle": 60.0}),
        deployment("malformed", [u("malformed")], health=never_eject),
        deployment("flaky", [u("flaky")]),
        deployment("busy-pair", [u("busy"), u("ok")], health=never_eject),
        deployment("busy", [u("busy")], health=never_eject, retries={"attempts": 2}),
        deployment("balance", [u("ok"), u("slow-300")]),
        deployment("heal", [u("fail"), u("ok")], health={"failures": 2, "cooldown": 1.5}),
        deployment("primary-down", [closed], fallback=["backup"], health=never_eject),
        deployment("backup", [u("ok")]),
        # a replica whose key the upstream refuses, beside a good one: never retried, never ejected
        deployment("bad-key", [u("status-401"), u("ok")], health={"failures": 2}),
        # its only replica cannot be reached, then comes back: ejected for ten minutes at once,
        # served again at once (panic routing)
        deployment("phoenix", [f"http://127.0.0.1:{PHOENIX_PORT}/ok/v1"],
                   health={"failures": 5, "cooldown": 600}, retries={"attempts": 1}),
        # every replica fails the request: its own failure, held against neither
        deployment("all-fail", [u("status-500"), u("status-502")], health={"failures": 1, "cooldown": 600}),
    ]  # fmt: skip
    config = tmp_path_factory.mktemp("fleet") / "config.yaml"
    config.write_text(yaml.safe_dump({"deployments": deployments}))
    with running_gateway(log_dir, config) as url:
        yield url


def post(gateway: str, dialect: str, model: str, stream: bool = False, timeout: float = 30) -> httpx.Response:
    body = {"model": model, "messages": USER, "stream": stream}
    return httpx.post(f"{gateway}{URLS[dialect]}", json=body, timeout=timeout)


def error_of(dialect: str, body: dict) -> str:
    return body["error"]["message"] if dialect == "openai" else body["message"]


def sse_events(text: str) -> list[Any]:
    return [
        line.removeprefix("data: ") if line == "data: [DONE]" else orjson.loads(line.removeprefix("data: "))
        for line in text.split("\n")
        if line.startswith("data: ")
    ]


def finish_reasons(events: list[Any]) -> list[str]:
    return [
        c["finish_reason"]
        for e in events
        if isinstance(e, dict)
        for c in e.get("choices", [])
        if c.get("finish_reason")
    ]


def metrics(gateway: str) -> dict[str, float]:
    values = {}
    for line in httpx.get(f"{gateway}/metrics").text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


def open_fds(gateway: str) -> int:
    port = int(gateway.rsplit(":", 1)[1])
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if f"--port\0{port}\0".encode() in cmdline:
                return len(os.listdir(f"/proc/{pid}/fd"))
    raise AssertionError("gateway process not found")


@pytest.fixture(scope="module")
def baseline_fds(gateway: str) -> int:
    for dialect in DIALECTS:
        post(gateway, dialect, "backup")
        post(gateway, dialect, "backup", stream=True)
    return open_fds(gateway)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_refused_connection_fails_over_to_the_next_replica(gateway, dialect, baseline_fds):
    responses = [post(gateway, dialect, "failover") for _ in range(6)]
    assert [r.status_code for r in responses] == [200] * 6
    assert all("fine answer" in r.text for r in responses)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_refused_connection_with_no_other_replica_is_503_in_shape(gateway, dialect):
    response = post(gateway, dialect, "refused")
    assert response.status_code == 503
    assert error_of(dialect, response.json())
    if dialect == "azure":
        assert response.headers["x-ms-error-code"]


@pytest.mark.parametrize("dialect", DIALECTS)
def test_fallback_to_another_deployment(gateway, dialect):
    response = post(gateway, dialect, "primary-down")
    assert response.status_code == 200 and "fine answer" in response.text


@pytest.mark.parametrize("dialect", DIALECTS)
def test_reset_mid_stream_ends_with_an_error_event(gateway, dialect):
    response = post(gateway, dialect, "reset", stream=True)
    assert response.status_code == 200
    events = sse_events(response.text)
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "error" in events[-1] if dialect == "openai" else events[-1]["status"] == 502
    assert finish_reasons(events) == []  # nothing invented
    assert "[DONE]" not in events


@pytest.mark.parametrize("dialect", DIALECTS)
def test_stall_before_first_token_sends_keepalives_then_times_out(gateway, dialect):
    """Past the header hold the stream starts, kept alive by empty lines (which every SDK skips:
    the Azure and Aleph Alpha SDKs raise on an SSE comment)."""
    started = time.monotonic()
    response = post(gateway, dialect, "stall", stream=True)
    elapsed = time.monotonic() - started
    assert response.status_code == 200
    assert response.text.startswith("\n\n") and ": keep-alive" not in response.text
    events = sse_events(response.text)
    assert len(events) == 1 and "did not answer in time" in error_of(dialect, events[0])
    assert 1.4 < elapsed < 10


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_stream_that_fails_before_its_first_token_is_a_real_status(gateway, dialect):
    """The 200 waits for the first token (issue 25: a keep-alive or a role-only first chunk
    sent the 200, and the failure became an error event the Azure SDK returned as an empty
    stream and the Aleph Alpha SDK as KeyError)."""
    stalled = post(gateway, dialect, "stall-held", stream=True)
    assert stalled.status_code == 504
    assert "time to first token" in error_of(dialect, stalled.json())
    cut = post(gateway, dialect, "role-then-reset", stream=True)
    assert cut.status_code == 502, cut.text
    assert error_of(dialect, cut.json())


def test_an_error_after_the_first_token_is_raised_by_every_dialects_sdk(gateway):
    """Once the 200 is out, a failure is an `error` event: openai, azure-ai-inference and
    aleph-alpha-client each raise on it, none returns a short stream as if it were whole."""
    import asyncio

    import openai
    from aleph_alpha_client import AsyncClient
    from aleph_alpha_client.chat import ChatRequest, Message, Role
    from azure.ai.inference import ChatCompletionsClient
    from azure.core.credentials import AzureKeyCredential

    client = openai.OpenAI(base_url=f"{gateway}/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.APIError, match="idle between chunks"):
        for _ in client.chat.completions.create(model="stall-mid", messages=USER, stream=True):
            pass
    azure = ChatCompletionsClient(endpoint=f"{gateway}/azure", credential=AzureKeyCredential("x"))
    with azure, pytest.raises(ValueError, match="event: error"):
        for _ in azure.complete(messages=USER, model="stall-mid", stream=True):
            pass

    async def aleph_alpha() -> None:
        request = ChatRequest(model="stall-mid", messages=[Message(role=Role.User, content="hello")])
        async with AsyncClient(token="x", host=f"{gateway}/aleph-alpha", total_retries=0) as aleph:
            async for _ in aleph.chat_with_streaming(request, model="stall-mid"):
                pass

    with pytest.raises(ValueError, match="event: error"):
        asyncio.run(aleph_alpha())


@pytest.mark.parametrize("dialect", DIALECTS)
def test_stall_before_first_token_without_stream_is_504(gateway, dialect):
    response = post(gateway, dialect, "stall")
    assert response.status_code == 504
    assert "time to first token" in error_of(dialect, response.json())


@pytest.mark.parametrize("dialect", DIALECTS)
def test_stall_mid_stream_hits_the_idle_timeout(gateway, dialect):
    response = post(gateway, dialect, "stall-mid", stream=True)
    events = sse_events(response.text)
    assert events[1]["choices"][0]["delta"]["content"] == "fine"
    assert "idle between chunks" in error_of(dialect, events[-1])
    assert finish_reasons(events) == []


def test_a_client_that_goes_away_mid_stream_is_noticed_and_the_upstream_hung_up_on(gateway, upstream):
    body = {"model": "stall-mid-long", "messages": USER, "stream": True}
    with httpx.stream("POST", f"{gateway}{URLS['openai']}", json=body, timeout=30) as response:
        lines = response.iter_lines()
        while '"fine"' not in next(lines):
            pass
        assert upstream.answering["stall-mid"] == 1  # the upstream is silent now, the stream open
    # the client hung up: the gateway stops waiting for the silent upstream long before its
    # 60 s idle timeout, and closes that connection too
    deadline = time.monotonic() + 5
    while upstream.answering["stall-mid"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert upstream.answering["stall-mid"] == 0
    assert metrics(gateway)["chatgate_requests_in_flight"] == 0


def test_a_client_that_gives_up_on_an_answer_not_streamed_is_heard_at_once(gateway, upstream):
    """The edge's watch of the connection (issue 30): the client leaves 0.3 s into a request
    whose upstream says nothing (its first-token timeout is 60 s): the gateway hangs up on the
    upstream at once, and the request is over (counted as 499)."""
    body = {"model": "stall-long", "messages": USER}
    before = upstream.counts["stall"]
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{gateway}{URLS['openai']}", json=body, timeout=httpx.Timeout(5, read=0.3))
    assert upstream.counts["stall"] == before + 1
    left = time.monotonic()
    while upstream.answering["stall"] and time.monotonic() - left < 5:
        time.sleep(0.01)
    assert upstream.answering["stall"] == 0
    assert time.monotonic() - left < 1.0
    figures = metrics(gateway)
    assert figures["chatgate_requests_in_flight"] == 0
    answered = {name: v for name, v in figures.items() if name.startswith("chatgate_requests_total{")}
    assert [v for name, v in answered.items() if "stall-long" in name and '"499"' in name] == [1], answered


@pytest.mark.parametrize("dialect", DIALECTS)
def test_malformed_json_is_502_in_shape(gateway, dialect):
    response = post(gateway, dialect, "malformed")
    assert response.status_code == 502
    assert error_of(dialect, response.json())


def test_a_5xx_is_not_tried_again_on_the_replica_that_gave_it(gateway, upstream):
    """Its only replica answers 500 once: the request fails in the gateway's words, that replica
    is not asked again for it, and nothing is held against the replica (issue 25: one bad
    request ejected a healthy replica)."""
    before = upstream.counts["flaky"]
    response = post(gateway, "openai", "flaky")
    assert response.status_code == 502
    message = response.json()["error"]["message"]
    assert "on its only replica; not tried again" in message
    assert "upstream 500" not in message  # the upstream's own words stay in the log
    assert upstream.counts["flaky"] - before == 1
    assert metrics(gateway)['chatgate_replica_healthy{deployment="flaky",replica="r0"}'] == 1
    again = post(gateway, "azure", "flaky")
    assert again.status_code == 200 and upstream.counts["flaky"] - before == 2


def test_a_request_that_fails_on_every_replica_ejects_none(gateway, upstream):
    before = upstream.counts["status-500"] + upstream.counts["status-502"]
    for _ in range(3):
        response = post(gateway, "openai", "all-fail")
        assert response.status_code == 502
        assert "on 2 replicas; not tried again" in response.json()["error"]["message"]
    assert upstream.counts["status-500"] + upstream.counts["status-502"] - before == 6  # each once
    values = metrics(gateway)
    assert values['chatgate_replica_healthy{deployment="all-fail",replica="r0"}'] == 1
    assert values['chatgate_replica_healthy{deployment="all-fail",replica="r1"}'] == 1
    assert "all-fail" not in httpx.get(f"{gateway}/ready").json()["unhealthy"]


@pytest.mark.parametrize("dialect", DIALECTS)
def test_429_is_retried_on_another_replica(gateway, dialect, upstream):
    responses = [post(gateway, dialect, "busy-pair") for _ in range(4)]
    assert all(r.status_code == 200 for r in responses)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_429_everywhere_is_passed_on_with_retry_after(gateway, dialect, upstream):
    before = upstream.counts["busy"]
    started = time.monotonic()
    response = post(gateway, dialect, "busy")
    assert response.status_code == 429
    assert response.headers["retry-after"] == "1"
    assert upstream.counts["busy"] - before == 2
    assert time.monotonic() - started >= 1.0  # the second try waited as told


def test_load_balancing_prefers_the_fast_replica(gateway, upstream):
    before_fast, before_slow = upstream.counts["ok"], upstream.counts["slow-300"]
    with ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(lambda _: post(gateway, "openai", "balance").status_code, range(48)))
    assert statuses == [200] * 48
    fast, slow = upstream.counts["ok"] - before_fast, upstream.counts["slow-300"] - before_slow
    assert fast + slow == 48
    assert fast > 2 * slow, (fast, slow)


def test_an_ejected_replica_gets_nothing_until_it_recovers(gateway, upstream):
    before = upstream.counts["fail"]
    for _ in range(10):
        assert post(gateway, "openai", "heal").status_code == 200
    failed = upstream.counts["fail"] - before
    assert failed == 2  # two consecutive failures eject it; then it is left alone
    values = metrics(gateway)
    assert values['chatgate_replica_healthy{deployment="heal",replica="r0"}'] == 0
    httpx.post(f"{upstream.url}/control/heal/fail", content=b"")
    time.sleep(1.6)  # the cool-down passes: the next pick may probe it
    for _ in range(20):
        assert post(gateway, "openai", "heal").status_code == 200
    assert upstream.counts["fail"] - before > failed  # probed, recovered, used again
    assert metrics(gateway)['chatgate_replica_healthy{deployment="heal",replica="r0"}'] == 1


def test_ready_reports_a_deployment_without_healthy_replicas(gateway):
    for _ in range(2):
        post(gateway, "openai", "failover")
    ready = httpx.get(f"{gateway}/ready")
    # `failover` still has a healthy replica; `refused` never ejects (failures: 1000)
    assert ready.status_code == 200, ready.text
    assert "failover" not in ready.json()["unhealthy"]


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_refused_key_is_not_retried_and_ejects_nothing(gateway, upstream, dialect):
    before = upstream.counts["status-401"] + upstream.counts["ok"]
    responses = [post(gateway, dialect, "bad-key") for _ in range(12)]
    refused = [r for r in responses if r.status_code == 502]
    assert refused and all(r.status_code in (200, 502) for r in responses)
    assert all("refused the gateway's credentials" in error_of(dialect, r.json()) for r in refused)
    assert upstream.counts["status-401"] + upstream.counts["ok"] - before == 12  # one try each
    values = metrics(gateway)
    assert values['chatgate_replica_healthy{deployment="bad-key",replica="r0"}'] == 1
    assert values.get('chatgate_retries_total{deployment="bad-key"}', 0) == 0


def test_a_sole_replica_that_comes_back_serves_at_once_despite_its_cool_down(gateway, upstream):
    """Panic routing: with every replica ejected, requests still try them. A replica that cannot
    be reached is ejected at once."""
    assert post(gateway, "openai", "phoenix").status_code == 503  # refused: ejected for 600 s
    assert metrics(gateway)['chatgate_replica_healthy{deployment="phoenix",replica="r0"}'] == 0
    ready = httpx.get(f"{gateway}/ready")
    assert ready.status_code == 200 and ready.json()["status"] == "degraded", ready.text
    assert "phoenix" in ready.json()["unhealthy"]
    assert post(gateway, "openai", "phoenix").status_code == 503  # still down: tried anyway
    with FaultUpstream(PHOENIX_PORT) as back:
        started = time.monotonic()
        response = post(gateway, "openai", "phoenix")
        assert response.status_code == 200 and time.monotonic() - started < 1
        assert back.counts["ok"] == 1
    values = metrics(gateway)
    assert values['chatgate_replica_healthy{deployment="phoenix",replica="r0"}'] == 1
    assert values['chatgate_panic_routed_total{deployment="phoenix"}'] >= 2
    assert "phoenix" not in httpx.get(f"{gateway}/ready").json()["unhealthy"]


@pytest.mark.parametrize(("dialect", "stream"), [("openai", False), ("lmi", True)], ids=["json", "stream"])
def test_a_client_that_goes_away_before_the_answer_cancels_the_upstream_request(
    gateway, upstream, dialect, stream
):
    key = (
        f'chatgate_request_errors_total{{code="ClientClosedRequest",deployment="stall",dialect="{dialect}"}}'
    )
    before = metrics(gateway).get(key, 0)
    with pytest.raises(httpx.ReadTimeout):
        post(gateway, dialect, "stall", stream=stream, timeout=0.4)
    deadline = time.monotonic() + 2
    while upstream.answering["stall"] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert upstream.answering["stall"] == 0  # hung up on long before the 1.5 s first-token timeout
    time.sleep(0.1)
    values = metrics(gateway)
    assert values[key] == before + 1
    route = URLS[dialect].partition("?")[0]
    labels = f'deployment="stall",dialect="{dialect}",key="anonymous",route="{route}",status="499"'
    assert values[f"chatgate_requests_total{{{labels}}}"] >= 1


def test_nothing_is_left_behind(gateway, upstream, baseline_fds):
    values = metrics(gateway)
    assert values["chatgate_requests_in_flight"] == 0
    # the gateway hung up on every stalled or broken upstream request
    for behaviour in ("stall", "stall-mid", "reset"):
        assert upstream.counts[behaviour] > 0
        assert upstream.answering[behaviour] == 0, behaviour
    # what stays open is the connection pools: bounded, not growing with the faults
    assert open_fds(gateway) <= baseline_fds + 30


def test_metrics_names_follow_conventions(gateway):
    text = httpx.get(f"{gateway}/metrics").text
    for name in (
        "chatgate_requests_total", "chatgate_request_duration_seconds_bucket",
        "gen_ai_server_time_to_first_token_seconds_bucket", "chatgate_usage_tokens_total",
        "chatgate_upstream_errors_total", "chatgate_retries_total", "chatgate_requests_in_flight",
        "chatgate_replica_healthy",
    ):  # fmt: skip
        assert re.search(rf"^{name}\b", text, re.M), name
