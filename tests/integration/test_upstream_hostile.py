"""The hostile-upstream matrix, through the gateway: an upstream that misbehaves on purpose
(tests/support/hostile_upstream.py), each case as a non-streamed and a streamed request.

Every case must end in a documented error in the dialect's shape, or a clean answer; no case may
take longer than its timeout; the gateway's memory returns to within 10 % of its baseline after
each; and no connection that carried a broken answer is ever used again.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml

from tests.support.hostile_upstream import BIG_TEXT, CASES, TEXT, HostileUpstream
from tests.support.servers import running_gateway

TIMEOUT = 2.0  # first token, idle gap, and the backend's first byte
TOTAL = 8.0
SLACK = 3.0  # a case may end this long after its timeout, and no later
RSS_GROWTH = 0.10

DONE = "done"  # the answer arrives whole: 200, and a stream ends with [DONE]
ERROR_EVENT = "error event"  # a stream that began ends with an error event, never a finish

# case → (non-streamed request: status, error code), (streamed request: status or outcome, code)
EXPECTED: dict[str, tuple[tuple[int, str | None], tuple[int | str, str | None]]] = {
    "ok": ((200, None), (DONE, None)),
    "big-length": ((200, None), (DONE, None)),
    "big-chunked": ((200, None), (DONE, None)),
    "huge-length": ((502, "ResponseTooLarge"), (502, "ResponseTooLarge")),
    "huge-chunked": ((502, "ResponseTooLarge"), (502, "ResponseTooLarge")),
    "chunk-size-2^64": ((502, "BadGateway"), (502, "BadGateway")),
    "endless": ((502, "ResponseTooLarge"), (502, "ResponseTooLarge")),
    "drip": ((504, "UpstreamTimeout"), (504, "UpstreamTimeout")),
    "bad-status-line": ((502, "BadGateway"), (502, "BadGateway")),
    "continue": ((200, None), (DONE, None)),
    "early-hints": ((200, None), (DONE, None)),
    "huge-header": ((502, "ResponseTooLarge"), (502, "ResponseTooLarge")),
    "many-headers": ((502, "ResponseTooLarge"), (502, "ResponseTooLarge")),
    "header-block": ((502, "ResponseTooLarge"), (502, "ResponseTooLarge")),
    "closed-mid-body": ((502, "BadGateway"), (502, "BadGateway")),
    "closed-mid-stream": ((502, "BadGateway"), (ERROR_EVENT, "BadGateway")),
    "closed-as-written": ((200, None), (DONE, None)),
    "gzip": ((200, None), (DONE, None)),
    "json-lines": ((200, None), (DONE, None)),
    "sse-comments": ((200, None), (DONE, None)),
    "crlf": ((200, None), (DONE, None)),
    "split": ((200, None), (DONE, None)),
}
assert set(EXPECTED) == set(CASES)


def hostile_deployment(name: str, url: str, **options: Any) -> dict[str, Any]:
    return {
        "name": name,
        "backend": "openai-compatible",
        "options": {"base_url": f"{url}/v1", "first_byte": TIMEOUT, "total": TOTAL, **options},
        # errors before the first token stay HTTP errors: no keep-alive comment starts the stream
        "timeouts": {"first_token": TIMEOUT, "idle": TIMEOUT, "total": TOTAL, "keepalive": 30},
        "retries": {"attempts": 1},  # each case sees its own failure, not a retry's
        "health": {"failures": 1000},
    }


@pytest.fixture(scope="module")
def upstream() -> Iterator[HostileUpstream]:
    with HostileUpstream() as server:
        yield server


@pytest.fixture(scope="module")
def gateway(upstream: HostileUpstream, tmp_path_factory: pytest.TempPathFactory, log_dir: Path):
    config = tmp_path_factory.mktemp("hostile") / "config.yaml"
    deployments = [
        hostile_deployment("hostile", upstream.url),
        # one connection, so the next request meets the connection the upstream closed
        hostile_deployment("race", upstream.url, max_connections=1),
    ]
    config.write_text(yaml.safe_dump({"deployments": deployments}))
    with running_gateway(log_dir, config) as url:
        yield url


def gateway_pid(url: str) -> int:
    port = int(url.rsplit(":", 1)[1])
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if f"--port\0{port}\0".encode() in cmdline:
                return int(pid)
    raise AssertionError("gateway process not found")


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def chat(url: str, model: str, content: str, stream: bool) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": content}], "stream": stream}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=TOTAL + SLACK + 5)


def streamed(text: str) -> tuple[str, list[Any]]:
    """(the content the stream carried, its events; [DONE] as the string)."""
    events: list[Any] = []
    for line in text.split("\n"):
        if line.startswith("data: "):
            data = line.removeprefix("data: ")
            events.append(data if data == "[DONE]" else orjson.loads(data))
    content = "".join(
        choice["delta"].get("content") or ""
        for event in events
        if isinstance(event, dict)
        for choice in event.get("choices") or ()
    )
    return content, events


@pytest.fixture(scope="module")
def baseline(gateway: str) -> int:
    """The gateway's RSS after a few ordinary answers of each kind."""
    for _ in range(20):
        for stream in (False, True):
            assert chat(gateway, "hostile", "hello", stream).status_code == 200
    return rss(gateway_pid(gateway))


CASE_PARAMS = [
    pytest.param(case, stream, id=f"{case}-{'stream' if stream else 'json'}")
    for case in EXPECTED
    for stream in (False, True)
]


@pytest.mark.parametrize(("case", "stream"), CASE_PARAMS)
def test_hostile_upstream(gateway: str, upstream: HostileUpstream, baseline: int, case: str, stream: bool):
    model = "race" if case == "closed-as-written" else "hostile"
    dropped = sum(upstream.dropped.values())
    started = time.monotonic()
    response = chat(gateway, model, f"case:{case}", stream)
    if case == "closed-as-written":  # the next request meets the connection closed under it
        response = chat(gateway, model, "case:ok", stream)
        assert sum(upstream.dropped.values()) == dropped + 1, "the race was not set up"
    elapsed = time.monotonic() - started
    (status, code) = EXPECTED[case][1 if stream else 0]
    expected_text = BIG_TEXT if case.startswith("big-") else TEXT
    if status == DONE:
        assert response.status_code == 200, response.text[:300]
        content, events = streamed(response.text)
        assert events[-1] == "[DONE]" and content == expected_text
    elif status == ERROR_EVENT:
        assert response.status_code == 200
        content, events = streamed(response.text)
        assert events[-1]["error"]["code"] == code, events[-1]
        assert "[DONE]" not in events
        assert not [
            c for e in events if isinstance(e, dict) for c in e.get("choices", []) if c.get("finish_reason")
        ]
    else:
        assert response.status_code == status, response.text[:300]
        if status == 200:
            assert response.json()["choices"][0]["message"]["content"] == expected_text
        else:
            assert response.json()["error"]["code"] == code, response.text[:300]
    assert elapsed < TOTAL + SLACK, f"{case} took {elapsed:.1f} s"
    # memory: back to within 10 % of the baseline (a big answer is released, not kept)
    pid = gateway_pid(gateway)
    deadline = time.monotonic() + 2
    while rss(pid) > baseline * (1 + RSS_GROWTH) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert rss(pid) <= baseline * (1 + RSS_GROWTH), (
        f"RSS {rss(pid) / 1e6:.1f} MB, baseline {baseline / 1e6:.1f} MB"
    )
    assert upstream.reused_broken == [], "a connection that carried a broken answer was used again"


def test_a_connection_closed_as_the_request_was_written_is_replayed_once_on_a_new_one(gateway, upstream):
    before = len(upstream.served)
    assert chat(gateway, "race", "case:closed-as-written", False).status_code == 200
    connection = upstream.served[-1][0]
    assert chat(gateway, "race", "case:ok", False).status_code == 200
    replayed = upstream.served[before + 1 :]
    assert len(replayed) == 1 and replayed[0][0] != connection  # one replay, on a new connection


def test_the_upstreams_request_id_is_logged(gateway, upstream, log_dir):
    marker = "case:ok"
    response = httpx.post(
        f"{gateway}/v1/chat/completions",
        json={"model": "hostile", "messages": [{"role": "user", "content": marker}]},
        headers={"x-request-id": "client-id-1234"},
        timeout=10,
    )
    assert response.status_code == 200
    time.sleep(0.3)
    lines = [
        orjson.loads(line)
        for path in log_dir.glob("gateway-*.log")
        for line in path.read_text().splitlines()
        if line.startswith("{") and "client-id-1234" in line
    ]
    assert lines and lines[-1]["upstream_request_id"] == "upstream-4711"
