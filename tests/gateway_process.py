"""A `chatgate serve` process a test can signal and whose exit it can watch."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

from tests.servers import ROOT, free_port, wait_until_healthy


class GatewayProcess:
    def __init__(self, process: subprocess.Popen, url: str, log: Path) -> None:
        self.process = process
        self.url = url
        self.log = log

    def signal(self, sig: int = signal.SIGTERM) -> None:
        self.process.send_signal(sig)

    def wait(self, timeout: float) -> int:
        return self.process.wait(timeout)

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@contextmanager
def gateway_process(tmp_path: Path, config: dict | None = None, *args: str) -> Iterator[GatewayProcess]:
    """Start `chatgate serve` with this config (a dict, written as YAML) and wait until healthy."""
    port = free_port()
    command = [sys.executable, "-m", "gateway", "serve", "--port", str(port), *args]
    if config is not None:
        path = tmp_path / f"chatgate-{port}.yaml"
        path.write_text(yaml.safe_dump(config))
        command += ["--config", str(path)]
    log = tmp_path / f"gateway-{port}.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            command, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT, env={**os.environ}
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, process, log)
        yield GatewayProcess(process, url, log)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
