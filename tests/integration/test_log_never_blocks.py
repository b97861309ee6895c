"""A reader that stops reading the gateway's stdout and stderr stalls the log, not the gateway: lines
are dropped and counted, requests keep flowing (the audit saw it freeze after 193 requests)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.support.servers import ROOT, free_port


def test_a_stdout_nobody_reads_blocks_nothing(tmp_path: Path):
    port = free_port()
    config = tmp_path / "chatgate.yaml"
    config.write_text("server: {log_buffer_lines: 300}\n")
    gateway = subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve", "--port", str(port), "--config", str(config)],
        cwd=ROOT,
        stdout=subprocess.PIPE,  # never read: the pipe's 64 KiB fill after a few hundred lines
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "the gateway did not start"
                time.sleep(0.1)
        body = {"model": "echo", "messages": [{"role": "user", "content": "log me " * 20}]}
        with httpx.Client(timeout=5) as client:
            statuses = [client.post(f"{url}/v1/chat/completions", json=body).status_code for _ in range(2000)]
            assert statuses == [200] * 2000
            assert client.get(f"{url}/health").status_code == 200
            metrics = client.get(f"{url}/metrics").text
        dropped = next(
            float(line.split()[1])
            for line in metrics.splitlines()
            if line.startswith("chatgate_log_lines_dropped_total")
        )
        assert dropped > 0
    finally:
        gateway.kill()
        gateway.wait()
