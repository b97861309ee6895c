"""Start real chatgate servers on loopback for tests (`python -m gateway serve` in a subprocess)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.support.dialect_routes import main_routes

ROOT = Path(__file__).resolve().parents[2]
AZURE_API_VERSION = "2024-05-01-preview"
# Where each dialect's chat operation lives on the default mounts (from the registry and documents).
CHAT_PATHS = {name: route.url for name, route in main_routes().items()}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until_healthy(url: str, process: subprocess.Popen, log: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"gateway exited with {process.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"gateway did not become healthy:\n{log.read_text()}")


@contextmanager
def started_gateway(
    log_dir: Path, config: Path | None = None, *args: str, healthy_within: float = 30
) -> Iterator[tuple[subprocess.Popen, str, Path]]:
    """A `chatgate serve` process, healthy: (the process, its base URL, its log)."""
    port = free_port()
    log = log_dir / f"gateway-{port}.log"
    command = [sys.executable, "-m", "gateway", "serve", "--port", str(port), *args]
    if config is not None:
        command += ["--config", str(config)]
    with log.open("wb") as sink:
        process = subprocess.Popen(
            command, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT, env={**os.environ}
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, process, log, healthy_within)
        yield process, url, log
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@contextmanager
def running_gateway(
    log_dir: Path, config: Path | None = None, *args: str, healthy_within: float = 30
) -> Iterator[str]:
    """Yield the base URL of a chatgate server running in its own process."""
    with started_gateway(log_dir, config, *args, healthy_within=healthy_within) as (_process, url, _log):
        yield url
