"""SIGTERM drains and exits 0; /ready says when not to send traffic. Real processes throughout."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.support.fault_upstream import FaultUpstream
from tests.support.gateway_process import gateway_process
from tests.support.servers import free_port

USER = [{"role": "user", "content": "hello"}]


def upstream_deployment(base_url: str) -> dict:
    return {"name": "up", "backend": "openai-compatible", "models": ["*"], "options": {"base_url": base_url}}


def read_stream(url: str, into: dict) -> None:
    """Read a whole stream from the gateway into `into` (lines, and how it ended)."""
    try:
        with httpx.stream(
            "POST",
            f"{url}/v1/chat/completions",
            json={"model": "m", "messages": USER, "stream": True},
            timeout=30,
        ) as response:
            into["status"] = response.status_code
            into["lines"] = [line for line in response.iter_lines() if line]
    except httpx.HTTPError as error:
        into["error"] = repr(error)


def wait_for(condition, timeout: float = 10) -> None:
    ends = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < ends, "timed out waiting"
        time.sleep(0.02)


def test_sigterm_drains_then_lets_the_stream_finish_and_exits_0(tmp_path: Path):
    drain = 1.5
    with FaultUpstream() as upstream:
        config = {
            "server": {"shutdown": {"drain": drain, "deadline": 20}},
            "deployments": [upstream_deployment(upstream.base_url("drip-600"))],
        }
        with gateway_process(tmp_path, config) as gateway:
            stream: dict = {}
            reader = threading.Thread(target=read_stream, args=(gateway.url, stream))
            reader.start()
            wait_for(lambda: upstream.answering["drip-600"] == 1)
            gateway.signal(signal.SIGTERM)
            signalled = time.monotonic()

            ready = httpx.get(f"{gateway.url}/ready", timeout=5)
            assert ready.status_code == 503
            assert ready.json()["status"] == "draining"
            # during the drain a new connection is still served
            assert httpx.get(f"{gateway.url}/health", timeout=5).status_code == 200
            time.sleep(max(0.0, signalled + drain + 0.7 - time.monotonic()))
            with pytest.raises(httpx.ConnectError):
                httpx.get(f"{gateway.url}/health", timeout=2)

            reader.join(30)
            assert stream.get("status") == 200, stream
            assert stream["lines"][-1] == "data: [DONE]", stream["lines"][-3:]
            assert gateway.wait(timeout=20) == 0, gateway.output()
            assert time.monotonic() - signalled < 10


def test_the_deadline_ends_what_is_still_running_and_exits_0(tmp_path: Path):
    with FaultUpstream() as upstream:
        config = {
            "server": {"shutdown": {"drain": 0, "deadline": 1}},
            "deployments": [upstream_deployment(upstream.base_url("stall"))],
        }
        with gateway_process(tmp_path, config) as gateway:
            stream: dict = {}
            reader = threading.Thread(target=read_stream, args=(gateway.url, stream))
            reader.start()
            wait_for(lambda: upstream.answering["stall"] == 1)
            signalled = time.monotonic()
            gateway.signal(signal.SIGTERM)
            assert gateway.wait(timeout=15) == 0, gateway.output()
            assert time.monotonic() - signalled < 5
            reader.join(10)
            assert not reader.is_alive()


def test_workers_drain_exit_0_and_leave_no_metrics_folder(tmp_path: Path):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    os.environ["TMPDIR"] = str(scratch)
    try:
        with gateway_process(tmp_path, None, "--workers", "2") as gateway:
            answer = httpx.post(
                f"{gateway.url}/v1/chat/completions", json={"model": "echo", "messages": USER}
            )
            assert answer.status_code == 200
            assert list(scratch.glob("chatgate-metrics-*")), "the workers share metrics through a folder"
            gateway.signal(signal.SIGTERM)
            assert gateway.wait(timeout=30) == 0, gateway.output()
    finally:
        del os.environ["TMPDIR"]
    assert not list(scratch.glob("chatgate-metrics-*"))


def worker_pids(supervisor: int) -> list[int]:
    children = Path(f"/proc/{supervisor}/task/{supervisor}/children").read_text().split()
    return [int(pid) for pid in children if "spawn_main" in Path(f"/proc/{pid}/cmdline").read_text()]


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_workers_stop_when_their_supervisor_is_killed(tmp_path: Path):
    """SIGKILL (the OOM killer) leaves no way to pass SIGTERM on: the workers notice they are
    orphans and stop, rather than serving the port unsupervised for ever."""
    with gateway_process(tmp_path, None, "--workers", "2") as gateway:
        wait_for(lambda: len(worker_pids(gateway.process.pid)) == 2)
        workers = worker_pids(gateway.process.pid)
        gateway.signal(signal.SIGKILL)
        gateway.wait(timeout=10)
        wait_for(lambda: not any(alive(pid) for pid in workers), timeout=15)
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{gateway.url}/health", timeout=2)


@pytest.mark.parametrize("on_error, status", [("fail-closed", 503), ("fail-open", 200)])
def test_ready_follows_an_unreachable_limit_store_when_it_matters(tmp_path: Path, on_error: str, status: int):
    nowhere = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    config = {
        "rate_limits": {"store": "redis", "redis": {"url": nowhere, "on_error": on_error}},
        "deployments": [
            {"name": "echo", "backend": "echo", "models": ["*"], "limits": {"requests_per_minute": 5}}
        ],
    }
    with gateway_process(tmp_path, config) as gateway:
        ready = httpx.get(f"{gateway.url}/ready", timeout=5)
        assert ready.status_code == status, ready.text
        assert ready.json()["limit_store_reachable"] is False
