"""Reloads that end nothing, with real processes: a stream running on a deployment that a reload
changes goes on to its end (the retired backend stays open until its last request ends), and a
reload or SIGTERM with a hung trace collector holds up neither the event loop nor the exit
(issue 24, findings 9 and 10)."""

from __future__ import annotations

import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from tests.integration.test_loop_never_starves import HealthProbe
from tests.support.fault_upstream import FaultUpstream
from tests.support.gateway_process import gateway_process


def until(condition, timeout: float = 15) -> None:
    ends = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < ends, "timed out"
        time.sleep(0.1)


def test_a_stream_on_a_changed_deployment_runs_to_its_end(tmp_path: Path):
    with FaultUpstream() as upstream:
        deployment = {
            "name": "up",
            "backend": "openai-compatible",
            "options": {"base_url": upstream.base_url("drip-800")},  # 5 pieces, 0.8 s apart
        }
        config = {"server": {"shutdown": {"deadline": 0.5}}, "deployments": [deployment]}
        with gateway_process(tmp_path, config) as gateway:
            path = next(tmp_path.glob("chatgate-*.yaml"))
            body = {"model": "up", "messages": [{"role": "user", "content": "hi"}], "stream": True}
            lines = []
            with httpx.stream("POST", f"{gateway.url}/v1/chat/completions", json=body, timeout=30) as answer:
                assert answer.status_code == 200
                for line in answer.iter_lines():
                    if line.startswith("data:") and not lines:
                        # the deployment changes under the running stream
                        changed = {**deployment, "timeouts": {"total": 599}}
                        path.write_text(yaml.safe_dump({**config, "deployments": [changed]}))
                        until(lambda: "reloaded" in gateway.output())
                    if line.startswith("data:"):
                        lines.append(line)
            assert lines[-1] == "data: [DONE]", lines
            assert not [line for line in lines if '"error"' in line], lines
            assert any('"finish_reason":"stop"' in line for line in lines), lines


class HungCollector:
    """An OTLP endpoint that takes connections and never answers."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.held: list[socket.socket] = []
        self.thread = threading.Thread(target=self.hold, daemon=True)

    def hold(self) -> None:
        while True:
            try:
                connection, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(connection)  # never read, never answered

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def __enter__(self) -> HungCollector:
        self.thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.sock.close()
        for connection in self.held:
            connection.close()


@pytest.fixture
def hung_collector(monkeypatch: pytest.MonkeyPatch) -> Iterator[HungCollector]:
    with HungCollector() as collector:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.url)
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")  # export at once, so it hangs at once
        yield collector


def test_a_reload_and_sigterm_with_a_hung_collector_hold_nothing_up(tmp_path: Path, hung_collector):
    config = {
        "server": {"shutdown": {"deadline": 1}},
        "tracing": {"enabled": True, "exporter": "otlp"},
        "deployments": [{"name": "echo", "backend": "echo"}],
    }
    with gateway_process(tmp_path, config) as gateway:
        body = {"model": "echo", "messages": [{"role": "user", "content": "traced"}]}
        with httpx.Client(timeout=10) as client:
            for _ in range(50):  # spans for the exporter to be stuck on
                assert client.post(f"{gateway.url}/v1/chat/completions", json=body).status_code == 200
        until(lambda: hung_collector.held)
        path = next(tmp_path.glob("chatgate-*.yaml"))
        with HealthProbe(gateway.url) as probe:
            path.write_text(yaml.safe_dump({**config, "tracing": {"enabled": True, "service_name": "other"}}))
            until(lambda: "reloaded" in gateway.output())
            time.sleep(3)  # the retired provider's shutdown, under way
        probe.assert_responsive()
        began = time.monotonic()
        gateway.signal(signal.SIGTERM)
        assert gateway.wait(timeout=30) == 0
        took = time.monotonic() - began
        assert took < 8, f"SIGTERM took {took:.1f} s with a 1 s deadline"
