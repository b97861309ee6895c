"""Requests/second of the OpenAI dialect on the echo backend vs a bare ASGI app with the same body.

Both servers run one uvicorn worker pinned to CPU 0; wrk runs on CPU 1. Needs `wrk`
(Debian: apt-get install wrk) and `taskset` (util-linux).

    python bench/spine.py [--seconds 10] [--connections 1,32]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
REQUEST = {"model": "echo", "messages": [{"role": "user", "content": "Hello!"}]}
LUA = """
wrk.method = "POST"
wrk.body = '{body}'
wrk.headers["Content-Type"] = "application/json"
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start(app: str, port: int, factory: bool) -> subprocess.Popen:
    command = [
        "taskset", "-c", "0", sys.executable, "-m", "uvicorn", app,
        "--port", str(port), "--log-level", "warning", "--no-access-log",
        "--loop", "uvloop", "--http", "httptools",
    ]  # fmt: skip
    if factory:
        command.append("--factory")
    process = subprocess.Popen(command, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=REQUEST, timeout=1)
            return process
        except httpx.TransportError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"{app} did not start")


def wrk(url: str, connections: int, seconds: int, script: Path) -> dict[str, float]:
    output = subprocess.run(
        [
            "taskset",
            "-c",
            "1",
            "wrk",
            "-t1",
            f"-c{connections}",
            f"-d{seconds}s",
            "--latency",
            "-s",
            str(script),
            url,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", output).group(1))
    p50 = re.search(r"50%\s+([\d.]+)(us|ms|s)", output)
    scale = {"us": 0.001, "ms": 1.0, "s": 1000.0}
    return {"rps": rps, "p50_ms": float(p50.group(1)) * scale[p50.group(2)]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--connections", default="1,32")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    missing = [tool for tool in ("wrk", "taskset") if shutil.which(tool) is None]
    if missing:
        print(f"bench needs {', '.join(missing)}: apt-get install wrk util-linux", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "post.lua"
        script.write_text(LUA.format(body=json.dumps(REQUEST)))
        contenders = {
            "chatgate (openai dialect, echo)": ("gateway.asgi:create", True),
            "bare ASGI, fixed body": ("bench.bare_app:app", False),
        }
        results: dict[str, dict[int, dict[str, float]]] = {}
        for name, (app, factory) in contenders.items():
            port = free_port()
            process = start(app, port, factory)
            try:
                url = f"http://127.0.0.1:{port}/v1/chat/completions"
                wrk(url, 8, 2, script)  # warm up
                results[name] = {
                    c: wrk(url, c, args.seconds, script)
                    for c in (int(x) for x in args.connections.split(","))
                }
            finally:
                process.terminate()
                process.wait()
    names = list(results)
    print(f"{'contender':<34} {'conns':>5} {'req/s':>10} {'p50 ms':>8}")
    for name in names:
        for connections, figures in results[name].items():
            print(f"{name:<34} {connections:>5} {figures['rps']:>10.0f} {figures['p50_ms']:>8.2f}")
    gateway, bare = (results[n] for n in names)
    for connections in gateway:
        ratio = gateway[connections]["rps"] / bare[connections]["rps"]
        print(f"ratio chatgate/bare at c={connections}: {ratio:.1%}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
