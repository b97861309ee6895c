"""A `chatgate serve` process a test can signal and whose exit it can watch."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

from tests.support.servers import started_gateway


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
    path = None
    if config is not None:
        path = tmp_path / f"chatgate-{len(list(tmp_path.glob('chatgate-*.yaml')))}.yaml"
        path.write_text(yaml.safe_dump(config))
    with started_gateway(tmp_path, path, *args) as (process, url, log):
        yield GatewayProcess(process, url, log)
