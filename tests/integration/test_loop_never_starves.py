"""No request can hold the gateway: a client leaving a long echo stream, or one request asking
for a huge echo answer, leaves /health answering within 100 ms all along, and the work and
memory such a request takes are bounded."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import orjson
import pytest

from tests.support.servers import ROOT, running_gateway

SLOWEST_PROBE = 0.1


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A gateway of its own: these tests load it on purpose."""
    with running_gateway(tmp_path_factory.mktemp("starve")) as url:
        yield url


class HealthProbe:
    """Probes /health every 50 ms from a process of its own while the block runs."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.latencies: list[float] = []
        self.failures: list[str] = []

    def __enter__(self) -> HealthProbe:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.health_probe", self.url],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert self.process.stdout.readline().strip() == b"ready"
        return self

    def __exit__(self, *exc_info: object) -> None:
        output, _ = self.process.communicate(b"", timeout=60)
        found = orjson.loads(output)
        self.latencies, self.failures = found["latencies"], found["failures"]

    def assert_responsive(self) -> None:
        assert not self.failures, self.failures
        assert len(self.latencies) >= 5, self.latencies
        slowest = max(self.latencies)
        shown = [round(seconds * 1000) for seconds in self.latencies]
        assert slowest < SLOWEST_PROBE, f"slowest /health probe {slowest * 1000:.0f} ms of {shown}"


def rss_kib(url: str) -> int:
    """The gateway's resident memory, from its own metrics."""
    text = httpx.get(f"{url}/metrics").text
    for line in text.splitlines():
        if line.startswith("process_resident_memory_bytes "):
            return int(float(line.split()[1])) // 1024
    raise AssertionError("process_resident_memory_bytes missing from /metrics")


def long_prompt(megabytes: float) -> str:
    return "word " * int(megabytes * 1024 * 1024 / 5)


def test_client_leaving_a_long_echo_stream_does_not_freeze_the_gateway(gateway: str):
    body = orjson.dumps(
        {
            "model": "echo",
            "messages": [{"role": "user", "content": long_prompt(1)}],
            "stream": True,
            "n": 64,
            "max_tokens": 65536,
        }
    )
    address = urlsplit(gateway)
    with HealthProbe(gateway) as probe:
        with socket.create_connection((address.hostname, address.port)) as client:
            client.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                + f"content-length: {len(body)}\r\n\r\n".encode()
                + body
            )
            received = 0
            while received < 256 * 1024:
                received += len(client.recv(65536))
        # the client is gone with the stream far from done; the gateway must notice at once
        time.sleep(2)
    probe.assert_responsive()
    answer = httpx.post(
        f"{gateway}/v1/chat/completions",
        json={"model": "echo", "messages": [{"role": "user", "content": "still there?"}]},
        timeout=5,
    )
    assert answer.status_code == 200


def test_one_huge_echo_request_is_bounded(gateway: str):
    """The audit's request: a 3.9 MB prompt and n=128 built a 499 MB answer and held the loop
    for a minute. Now the answer is bounded like a model's (max_tokens default) and the loop
    keeps turning."""
    before = rss_kib(gateway)
    payload = {"model": "echo", "messages": [{"role": "user", "content": long_prompt(3.9)}], "n": 128}
    with HealthProbe(gateway) as probe:
        began = time.perf_counter()
        answer = httpx.post(f"{gateway}/v1/chat/completions", json=payload, timeout=120)
        took = time.perf_counter() - began
        time.sleep(0.3)
    probe.assert_responsive()
    assert answer.status_code == 200, answer.text[:500]
    assert len(answer.content) < 32 * 1024 * 1024
    body = answer.json()
    assert len(body["choices"]) == 128
    assert {c["finish_reason"] for c in body["choices"]} == {"length"}
    assert body["usage"]["completion_tokens"] == 128 * 4096  # the echo backend's default limit
    assert took < 30
    assert rss_kib(gateway) - before < 300 * 1024


def test_an_answer_past_the_response_limit_is_refused_in_shape(gateway: str):
    """Asked for more than max_response_bytes (32 MiB): a 502 in the dialect's shape, not a
    half-gigabyte body; a stream ends with an error event instead."""
    payload = {
        "model": "echo",
        "messages": [{"role": "user", "content": long_prompt(1)}],
        "n": 128,
        "max_tokens": 65536,
        "logprobs": True,
        "top_logprobs": 20,
    }
    with HealthProbe(gateway) as probe:
        answer = httpx.post(f"{gateway}/v1/chat/completions", json=payload, timeout=120)
        time.sleep(0.3)
    probe.assert_responsive()
    assert answer.status_code == 502, answer.text[:300]
    assert answer.json()["error"]["code"] == "ResponseTooLarge"

    with httpx.stream(
        "POST", f"{gateway}/v1/chat/completions", json={**payload, "stream": True}, timeout=120
    ) as stream:
        assert stream.status_code == 200
        size = 0
        last = b""
        for line in stream.iter_lines():
            size += len(line) + 1
            if line.strip():
                last = line.encode()
    assert size < 33 * 1024 * 1024
    assert b"ResponseTooLarge" in last, last[:300]


def test_a_deployment_bounds_max_tokens(tmp_path: Path):
    """`capabilities.max_output_tokens` refuses more with 422 naming the parameter, and
    `default_max_tokens` bounds a request that names no limit."""
    config = tmp_path / "chatgate.yaml"
    config.write_text(
        "deployments:\n"
        "  - {name: short, backend: echo, models: ['*'],\n"
        "     capabilities: {max_output_tokens: 100, default_max_tokens: 3}}\n"
    )
    with running_gateway(tmp_path, config) as url:
        user = [{"role": "user", "content": "one two three four five"}]
        refused = httpx.post(
            f"{url}/v1/chat/completions", json={"model": "x", "messages": user, "max_tokens": 101}
        )
        assert refused.status_code == 422, refused.text
        assert refused.json()["error"]["param"] == "max_tokens"
        bounded = httpx.post(f"{url}/v1/chat/completions", json={"model": "x", "messages": user})
        assert bounded.status_code == 200, bounded.text
        assert bounded.json()["usage"]["completion_tokens"] == 3
        assert bounded.json()["choices"][0]["finish_reason"] == "length"
