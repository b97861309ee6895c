"""A real redis-server on a loopback port, for the tests that share state through it."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis

from tests.support.servers import free_port


@contextmanager
def running_redis(workdir: Path) -> Iterator[tuple[str, subprocess.Popen]]:
    """(its URL, its process) — the process, so a test can stop or pause it."""
    server = shutil.which("redis-server")
    assert server, "redis-server is required (scripts/run-tests installs it)"
    port = free_port()
    process = subprocess.Popen(
        [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(workdir)],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    try:
        yield url, process
    finally:
        process.kill()
        process.wait(timeout=10)
