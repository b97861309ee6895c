"""`python -m bench.profile`: where a chatgate request's CPU goes, part by part (issue 30).

One chatgate worker runs pinned to CPU 0 — the echo backend, or openai-compatible in front of
the bench's nginx upstream (`--upstream`), with the policy on or off (`--policy`), streamed or
not (`--stream`) — while wrk loads it at c=32 from CPU 1. py-spy samples the worker's stacks
meanwhile, and the worker's CPU time over the run gives its µs per request. Each sample is put
to the part of the gateway its innermost frame belongs to (`PARTS`); a part's share of the
samples times the µs per request is what that part costs a request. The table is the profile
that says why a goal of `python -m bench` is missed, and where to look next.

Needs py-spy (`pip install py-spy==0.4.1`, in the `bench` extra), wrk and taskset, and nginx
for `--upstream`.

    python -m bench.profile [--upstream] [--policy] [--stream] [--dialect chat|messages|responses]
                            [--seconds 20] [--raw FILE]
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

import orjson
import yaml

from bench import load
from bench.dialects import DIALECTS
from bench.processes import (
    Server,
    accepts_connections,
    answers_health,
    free_port,
    pinned,
    process_cpu_seconds,
    start_server,
)
from bench.run import HIGH_LIMITS, POOL, ROOT
from bench.upstream import REQUEST, STREAM_CHUNKS, STREAM_REQUEST, nginx_command, write_nginx_files

KEY = "sk-bench-profile"
SAMPLES_PER_SECOND = 400
# A sample's part, by the file of its innermost frame (the first pattern that matches).
PARTS: tuple[tuple[str, str], ...] = (
    (
        "HTTP server: uvicorn, the edge, the event loop",
        r"uvicorn/|gateway/server/|asyncio/(runners|events|base_events)|uvloop",
    ),
    ("upstream HTTP client: aiohttp", r"aiohttp/|multidict|yarl|backends/http/client"),
    ("backend: its request and answer", r"backends/"),
    (
        "front door: route, key, body read and validated",
        r"gateway/http/(front_door|validation|call)\.py|gateway/app\.py|connexion/|jsonschema|json/|urllib/",
    ),
    ("translator: read, seed rules, render", r"gateway/dialects/|generated/|gateway/core/parameters"),
    ("policy steps", r"gateway/policy/|gateway/runtime\.py"),
    (
        "dispatch: attempt, timers, tasks",
        r"gateway/fleet/|gateway/core/disconnect|asyncio/(tasks|timeouts|locks)",
    ),
    (
        "answer: fold, stream, response",
        r"gateway/chat\.py|gateway/http/streaming|gateway/core/canonical|starlette/",
    ),
    (
        "records: metrics, access log, ids, trace",
        r"gateway/telemetry/|gateway/core/(ids|trace)|prometheus_client",
    ),
)
OTHER = "other"
# Threads that wait most of the time (the log writer, the DNS resolver): not the request path.
IDLE_THREADS = ("log_sink.py", "pycares", "threading.py", "queue.py", "concurrent/futures")


def part_of(frame: str) -> str:
    for name, pattern in PARTS:
        if re.search(pattern, frame):
            return name
    return OTHER


def shares(collapsed: Iterable[str]) -> dict[str, float]:
    """Each part's share of the busy samples, from py-spy's raw output (`stack count` lines,
    frames joined by ';', innermost last); samples in an idle thread are left out."""
    counts: collections.Counter[str] = collections.Counter()
    for line in collapsed:
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack or not count.isdigit() or any(mark in stack for mark in IDLE_THREADS):
            continue
        counts[part_of(stack.split(";")[-1])] += int(count)
    total = sum(counts.values())
    return {name: count / total for name, count in counts.most_common()} if total else {}


def config(upstream: str | None, policy: bool) -> dict:
    deployment: dict = {"name": REQUEST["model"], "backend": "echo"}
    stream_deployment: dict = {"name": STREAM_REQUEST["model"], "backend": "echo"}
    if upstream is not None:
        deployment.update(backend="openai-compatible", options={"base_url": f"{upstream}/v1", **POOL})
        stream_deployment.update(
            backend="openai-compatible", options={"base_url": f"{upstream}/stream/v1", **POOL}
        )
    found: dict = {"deployments": [deployment, stream_deployment]}
    if policy:
        for entry in found["deployments"]:
            entry["limits"] = HIGH_LIMITS
        sha256 = hashlib.sha256(KEY.encode()).hexdigest()
        found["keys"] = [{"name": "bench", "sha256": sha256, "limits": HIGH_LIMITS}]
        found["rate_limits"] = {"store": "memory"}
    return found


def profile(args: argparse.Namespace, tmp: Path) -> int:
    servers: list[Server] = []
    try:
        upstream = None
        if args.upstream:
            port = free_port()
            conf = write_nginx_files(tmp, port)
            nginx = start_server(
                "nginx", pinned("1", nginx_command(tmp, conf)), port, tmp / "nginx.log",
                accepts_connections(port), tmp,
            )  # fmt: skip
            servers.append(nginx)
            upstream = nginx.url
        path = tmp / "chatgate.yaml"
        path.write_text(yaml.safe_dump(config(upstream, args.policy), sort_keys=False))
        port = free_port()
        command = [sys.executable, "-m", "gateway", "serve", "--config", str(path), "--port", str(port),
                   "--log-level", "warning"]  # fmt: skip
        gateway = start_server(
            "chatgate", pinned("0", command), port, tmp / "chatgate.log", answers_health(port), ROOT
        )
        servers.append(gateway)
        dialect = DIALECTS[args.dialect]
        body = orjson.dumps(dialect.stream_request if args.stream else dialect.request)
        headers = {"Content-Type": "application/json"}
        if args.policy:
            headers["Authorization"] = f"Bearer {KEY}"
        url = gateway.url + dialect.path
        load.WrkRun(url, body, headers, 32, 3, "1").result()  # warm up
        raw = args.raw or tmp / "profile.txt"
        # --nonblocking: read the stacks without pausing the worker (pausing it 400 times a
        # second slowed it by a quarter and put its time in the wrong frames)
        sampler = [
            "py-spy", "record", "--pid", str(gateway.process.pid), "--rate", str(SAMPLES_PER_SECOND),
            "--duration", str(args.seconds), "--format", "raw", "--output", str(raw), "--nonblocking",
        ]  # fmt: skip
        spy = subprocess.Popen(pinned("1", sampler), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(1)  # py-spy attached
        cpu = process_cpu_seconds(gateway.process.pid)
        result = load.WrkRun(url, body, headers, 32, args.seconds - 2, "1").result()
        spent = process_cpu_seconds(gateway.process.pid) - cpu
        _, errors = spy.communicate(timeout=args.seconds + 60)
        if spy.returncode != 0 or not raw.exists():
            print(f"py-spy failed: {errors.decode(errors='replace')[-500:]}", file=sys.stderr)
            return 1
        per_request = spent / result.requests * 1e6 if result.requests else 0.0
        report(args, result, per_request, shares(raw.read_text(errors="replace").splitlines()))
        return 0 if not result.errors else 1
    finally:
        for server in reversed(servers):
            server.stop()


def report(
    args: argparse.Namespace, result: load.WrkResult, per_request: float, found: dict[str, float]
) -> None:
    what = described(args)
    print(f"chatgate ({what}), c=32: {result.rps:,.0f} req/s, {result.errors} errors, "
          f"{per_request:.0f} µs CPU per request")  # fmt: skip
    unit = "µs/chunk" if args.stream else "µs/req"
    print(f"{'part':<52} {'share':>6} {unit:>9}")
    for name, share in found.items():
        cost = per_request * share / (STREAM_CHUNKS if args.stream else 1)
        print(f"{name:<52} {share:>6.1%} {cost:>9.1f}")


def add_request_options(parser: argparse.ArgumentParser, per_chunk: str) -> None:
    """What is asked of which gateway: the options this and bench/instructions.py share."""
    parser.add_argument(
        "--upstream", action="store_true", help="openai-compatible in front of nginx (else echo)"
    )
    parser.add_argument("--policy", action="store_true", help="a key, and rate limits that never refuse")
    parser.add_argument("--stream", action="store_true", help=f"streamed requests ({per_chunk})")
    parser.add_argument(
        "--dialect", choices=tuple(DIALECTS), default="chat", help="the client dialect asked (default: chat)"
    )


def described(args: argparse.Namespace) -> str:
    """The request and gateway those options chose, in words."""
    if paced := getattr(args, "paced", None):  # bench.instructions' own
        what = f"openai-compatible → an upstream at a chunk every {paced} ms"
    else:
        what = "openai-compatible → nginx" if args.upstream else "echo"
    what += ", policy on" if args.policy else ""
    what += ", streamed" if args.stream else ""
    return what + (f", {DIALECTS[args.dialect].label}" if args.dialect != "chat" else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__.splitlines()[0])
    add_request_options(parser, "µs per chunk")
    parser.add_argument("--seconds", type=int, default=20, help="seconds sampled")
    parser.add_argument("--raw", type=Path, help="keep py-spy's raw samples here")
    args = parser.parse_args(argv)
    needed = ["py-spy", "wrk", "taskset"] + (["nginx"] if args.upstream else [])
    if missing := [tool for tool in needed if shutil.which(tool) is None]:
        print(
            f"bench.profile needs {', '.join(missing)} (py-spy: pip install py-spy==0.4.1)", file=sys.stderr
        )
        return 2
    with tempfile.TemporaryDirectory(prefix="chatgate-profile-") as tmp:
        return profile(args, Path(tmp))


if __name__ == "__main__":
    sys.exit(main())
