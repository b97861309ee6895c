"""`python -m bench`: chatgate against a direct nginx upstream and a Python floor, in one run.

Servers run on the first CPU; wrk, the upstream nginx and the stream clients on the second.
Contenders (each a separate process, started and stopped in turn):

  nginx, direct        the upstream itself, answering a fixed chat.completion (and SSE stream)
  Python floor         raw ASGI + one pooled aiohttp client passing bodies through to nginx
  chatgate → nginx     openai-compatible backend; also streams, memory over many requests
  chatgate, echo       the embedded backend: the gateway's own cost without an upstream
  chatgate, policy on  a key (Bearer) and in-memory rate limits too high ever to refuse
  chatgate, 2 workers  `--workers 2` on both CPUs, against the pinned single worker

It installs nothing: it says what is missing and stops. Results: a table on stdout,
<out>/latest.json and <out>/latest.png.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import importlib.util
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import orjson
import yaml

from bench import load, report
from bench.processes import (
    Server,
    accepts_connections,
    answers_health,
    busy_share,
    free_port,
    pinned,
    start_server,
)
from bench.upstream import REQUEST, STREAM_CHUNKS, STREAM_REQUEST, nginx_command, write_nginx_files

ROOT = Path(__file__).resolve().parent.parent
JSON_PATH = "/v1/chat/completions"
STREAM_PATH = "/stream/v1/chat/completions"  # nginx's stream location (the floor keeps paths)
HIGH_LIMITS = {"requests_per_minute": 10**9, "tokens_per_minute": 10**12}  # counted, never refusing
POOL = {"max_connections": 100, "max_keepalive": 100}  # the same pool size as the floor's client
RELAY_CONCURRENCY = 32
ALL_CONTENDERS = tuple(report.CONTENDERS)


@dataclass(frozen=True)
class Profile:
    mode: str
    seconds: float  # per wrk point
    warmup: float
    first_chunk_streams: int
    relay_seconds: float
    memory_requests: int
    memory_cap_seconds: float  # sending the memory run's requests stops here whatever the count
    contenders: tuple[str, ...]


PROFILES = {
    "full": Profile("full", 10, 2, 200, 10, 100_000, 300, ALL_CONTENDERS),
    "quick": Profile("quick", 3, 1, 100, 3, 20_000, 120, ALL_CONTENDERS),
    "smoke": Profile("smoke", 1, 1, 20, 1, 500, 10, ("direct", "floor", "upstream", "echo")),
}
TOOLS = {
    "nginx": "apt-get install nginx",
    "wrk": "apt-get install wrk",
    "taskset": "apt-get install util-linux",
}


def missing_requirements(chart: bool) -> list[str]:
    missing = [f"{tool} ({how})" for tool, how in TOOLS.items() if shutil.which(tool) is None]
    modules = ["aiohttp"] + (["matplotlib"] if chart else [])
    missing += [
        f"{module} (python -m pip install {module})"
        for module in modules
        if importlib.util.find_spec(module) is None
    ]
    return missing


@dataclass(frozen=True)
class Cores:
    server: str | None  # taskset list for servers, None when there is one CPU (no pinning)
    load: str | None
    both: str | None

    @classmethod
    def pick(cls) -> Cores:
        available = sorted(os.sched_getaffinity(0))
        if len(available) < 2:
            return cls(None, None, None)
        server, load_ = available[0], available[1]
        return cls(str(server), str(load_), f"{server},{load_}")


class Bench:
    """One run: owns the temporary directory, the upstream and the results."""

    def __init__(self, profile: Profile, tmp: Path, cores: Cores, stack: contextlib.ExitStack) -> None:
        self.profile = profile
        self.tmp = tmp
        self.cores = cores
        self.stack = stack
        self.started = time.monotonic()
        self.body = orjson.dumps(REQUEST)
        self.stream_body = orjson.dumps(STREAM_REQUEST)
        self.results: dict[str, Any] = {"http": {}, "streaming": {"first_chunk": {}, "errors": {}}}

    # ----- plumbing -------------------------------------------------------------------------

    def say(self, message: str) -> None:
        print(f"[{time.monotonic() - self.started:5.0f} s] {message}", file=sys.stderr, flush=True)

    def start(
        self, name: str, command: list[str], port: int, ready: Callable[[], bool], **env: str
    ) -> Server:
        log = self.tmp / f"{name.replace(' ', '-')}-{port}.log"
        environment = {**os.environ, "PYTHONPATH": str(ROOT), **env}
        server = start_server(name, command, port, log, ready, cwd=ROOT, env=environment)
        self.stack.callback(server.stop)
        return server

    def start_nginx(self, name: str, cores: str | None) -> Server:
        port = free_port()
        conf = write_nginx_files(self.tmp, port)
        return self.start(name, pinned(cores, nginx_command(self.tmp, conf)), port, accepts_connections(port))

    def start_chatgate(self, name: str, config: dict[str, Any], workers: int = 1) -> Server:
        port = free_port()
        path = self.tmp / f"chatgate-{port}.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        command = [
            sys.executable, "-m", "gateway", "serve", "--config", str(path), "--port", str(port),
            "--log-level", "warning",
        ]  # fmt: skip
        if workers != 1:
            command += ["--workers", str(workers)]
        cores = self.cores.server if workers == 1 else self.cores.both
        return self.start(name, pinned(cores, command), port, answers_health(port))

    def chatgate_config(self, backend: str, policy_key_sha256: str | None = None) -> dict[str, Any]:
        def deployment(name: str, path: str) -> dict[str, Any]:
            entry: dict[str, Any] = {"name": name, "backend": backend}
            if backend == "openai-compatible":
                entry["options"] = {"base_url": f"{self.upstream.url}{path}", **POOL}
            if policy_key_sha256:
                entry["limits"] = HIGH_LIMITS
            return entry

        config: dict[str, Any] = {
            "deployments": [
                deployment(REQUEST["model"], "/v1"),
                deployment(STREAM_REQUEST["model"], "/stream/v1"),
            ]
        }
        if policy_key_sha256:
            config["keys"] = [{"name": "bench", "sha256": policy_key_sha256, "limits": HIGH_LIMITS}]
            config["rate_limits"] = {"store": "memory"}
        return config

    # ----- measuring ------------------------------------------------------------------------

    def check_answer(self, url: str, headers: dict[str, str]) -> None:
        """One request by hand before any load: a 200 with a completion, so wrk counts real work."""
        response = httpx.post(url, content=self.body, headers={**headers, "content-type": "application/json"})
        if response.status_code != 200:
            raise RuntimeError(f"{url} answered {response.status_code}: {response.text[:300]}")
        content = response.json()["choices"][0]["message"]["content"]
        if not content:
            raise RuntimeError(f"{url} answered an empty completion")

    def check_stream(self, url: str, headers: dict[str, str]) -> None:
        with httpx.stream(
            "POST", url, content=self.stream_body, headers={**headers, "content-type": "application/json"}
        ) as response:
            raw = response.read()
        if response.status_code != 200 or not raw.rstrip().endswith(b"data: [DONE]"):
            raise RuntimeError(f"{url} streamed {response.status_code}: {raw[-300:]!r}")
        chunks = raw.count(b"data:") - 1
        if chunks < STREAM_CHUNKS - 1:
            raise RuntimeError(f"{url} streamed {chunks} chunks, expected about {STREAM_CHUNKS}")

    def wrk(
        self, server: Server, url: str, connections: int, seconds: float, **headers: str
    ) -> tuple[load.WrkResult, float, list[float]]:
        """A wrk run, the server's CPU use (1.0 = one core) and, per process, the busiest first."""
        cpu, started = server.cpu_by_process(), time.monotonic()
        result = load.wrk(url, self.body, headers, connections, seconds, self.cores.load)
        elapsed = time.monotonic() - started
        shares = [(used - cpu.get(pid, 0.0)) / elapsed for pid, used in server.cpu_by_process().items()]
        return result, sum(shares), sorted(shares, reverse=True)

    def measure_http(
        self,
        key: str,
        server: Server,
        headers: dict[str, str] | None = None,
        connections: tuple[int, ...] = report.CONNECTIONS,
        after_warmup: Callable[[], None] | None = None,
    ) -> list[load.WrkResult]:
        headers = {"Content-Type": "application/json", **(headers or {})}
        url = server.url + JSON_PATH
        self.check_answer(url, headers)
        self.wrk(server, url, 32, self.profile.warmup, **headers)
        if after_warmup:
            after_warmup()
        points, runs = {}, []
        for count in connections:
            result, busy, by_process = self.wrk(server, url, count, self.profile.seconds, **headers)
            points[str(count)] = {**result.as_dict(), "server_cpu": busy}
            if len(by_process) > 1:
                points[str(count)]["server_cpu_by_process"] = by_process
            runs.append(result)
            errors = f", {result.errors} ERRORS" if result.errors else ""
            self.say(
                f"{report.CONTENDERS[key]}, c={count}: {result.rps:,.0f} req/s, p50 {result.p50_ms:.2f} ms, "
                f"p99 {result.p99_ms:.2f} ms, cpu {busy:.0%}{errors}"
            )
        self.results["http"][key] = {"label": report.CONTENDERS[key], "points": points, "error": None}
        return runs

    def first_chunk(self, source: str, url: str, headers: dict[str, str] | None = None) -> None:
        try:
            self.check_stream(url, headers or {})
            found = asyncio.run(
                load.first_chunk_times(
                    url, self.stream_body, headers_for(headers), self.profile.first_chunk_streams
                )
            )
        except Exception as error:
            self.results["streaming"]["errors"][source] = f"{type(error).__name__}: {error}"
            self.say(f"first chunk, {source}: {error}")
            return
        self.results["streaming"]["first_chunk"][source] = found.as_dict()
        self.say(f"first chunk, {source}: p50 {found.p50_ms:.2f} ms, p99 {found.p99_ms:.2f} ms")

    def relay(self, server: Server) -> None:
        url = server.url + JSON_PATH
        cpu, started = server.cpu_seconds(), time.monotonic()
        found = asyncio.run(
            load.relay_rate(
                url, self.stream_body, headers_for(None), RELAY_CONCURRENCY, self.profile.relay_seconds
            )
        )
        busy = (server.cpu_seconds() - cpu) / (time.monotonic() - started)
        self.results["streaming"]["relay"] = {**found.as_dict(), "server_cpu": busy}
        self.say(
            f"relay: {found.chunks_per_s:,.0f} chunks/s ({found.streams} streams, cpu {busy:.0%}, "
            f"client cpu {found.client_cpu:.0%}, {found.errors} errors)"
        )

    # ----- contenders -----------------------------------------------------------------------

    def contender(self, key: str, body: Callable[[], None]) -> None:
        if key not in self.profile.contenders:
            return
        try:
            body()
        except Exception as error:
            message = f"{type(error).__name__}: {error}"
            self.results["http"][key] = {"label": report.CONTENDERS[key], "points": {}, "error": message}
            self.say(f"{report.CONTENDERS[key]}: {message}")

    def run_direct(self) -> None:
        server = self.start_nginx("nginx direct", self.cores.server)
        self.measure_http("direct", server)
        self.first_chunk("direct", server.url + STREAM_PATH)
        server.stop()

    def run_floor(self) -> None:
        port = free_port()
        command = [
            sys.executable, "-m", "uvicorn", "bench.floor:app", "--port", str(port),
            "--loop", "uvloop", "--http", "httptools", "--lifespan", "on", "--workers", "1",
            "--no-access-log", "--log-level", "warning",
        ]  # fmt: skip
        server = self.start(
            "floor", pinned(self.cores.server, command), port, accepts_connections(port),
            BENCH_UPSTREAM=self.upstream.url,
        )  # fmt: skip
        self.measure_http("floor", server)
        self.first_chunk("floor", server.url + STREAM_PATH)
        server.stop()

    def run_upstream(self) -> None:
        """The main contender; also the streams and the memory figures."""
        server = self.start_chatgate("chatgate upstream", self.chatgate_config("openai-compatible"))
        memory: dict[str, Any] = {"idle_mb": megabytes(server.rss_bytes())}
        self.results["memory"] = memory

        def after_warmup() -> None:
            memory["warm_mb"] = megabytes(server.rss_bytes())

        runs = self.measure_http("upstream", server, after_warmup=after_warmup)
        self.first_chunk("chatgate", server.url + JSON_PATH)
        try:
            self.check_stream(server.url + JSON_PATH, {})
            self.relay(server)
        except Exception as error:
            self.results["streaming"]["errors"]["relay"] = f"{type(error).__name__}: {error}"
            self.say(f"relay: {error}")
        counted = sum(run.requests for run in runs)
        rate = max(runs[-1].rps, 1.0)
        deadline = time.monotonic() + self.profile.memory_cap_seconds
        while counted < self.profile.memory_requests and time.monotonic() < deadline:
            # wrk has no request count: run it for the time the rest should take, until reached
            remaining = self.profile.memory_requests - counted
            seconds = min(math.ceil(remaining / rate), max(1, deadline - time.monotonic()))
            self.say(f"memory: {remaining:,} more requests to reach {self.profile.memory_requests:,}")
            more, _, _ = self.wrk(server, server.url + JSON_PATH, 32, seconds)
            if more.errors:
                raise RuntimeError(f"{more.errors} errors while sending the memory run's requests")
            counted += more.requests
            rate = max(more.rps, 1.0)
        memory.update(
            requests=counted,
            target_requests=self.profile.memory_requests,
            after_mb=megabytes(server.rss_bytes()),
        )
        self.say(
            f"memory: idle {memory['idle_mb']:.1f} MB, warm {memory['warm_mb']:.1f} MB, "
            f"after {counted:,} requests {memory['after_mb']:.1f} MB"
        )
        server.stop()

    def run_echo(self) -> None:
        server = self.start_chatgate("chatgate echo", self.chatgate_config("echo"))
        self.measure_http("echo", server)
        server.stop()

    def run_policy(self) -> None:
        from gateway.policy.auth import new_key

        key, sha256 = new_key()
        server = self.start_chatgate("chatgate policy", self.chatgate_config("openai-compatible", sha256))
        refused = httpx.post(
            server.url + JSON_PATH, content=self.body, headers={"content-type": "application/json"}
        )
        if refused.status_code != 401:
            raise RuntimeError(f"policy is not on: a request without a key got {refused.status_code}")
        self.measure_http("policy", server, {"Authorization": f"Bearer {key}"})
        server.stop()

    def run_workers(self) -> None:
        server = self.start_chatgate(
            "chatgate 2 workers", self.chatgate_config("openai-compatible"), workers=2
        )
        self.measure_http("workers2", server, connections=(32,))
        server.stop()

    def run(self) -> dict[str, Any]:
        self.upstream = self.start_nginx("nginx upstream", self.cores.load)
        check = httpx.post(self.upstream.url + JSON_PATH, content=self.body)
        if check.status_code != 200:
            raise RuntimeError(f"the nginx upstream answered {check.status_code}: {self.upstream.log_tail()}")
        self.contender("direct", self.run_direct)
        self.contender("floor", self.run_floor)
        self.contender("upstream", self.run_upstream)
        self.contender("echo", self.run_echo)
        self.contender("policy", self.run_policy)
        self.contender("workers2", self.run_workers)
        return self.results


def headers_for(headers: dict[str, str] | None) -> dict[str, str]:
    return {"content-type": "application/json", **(headers or {})}


def megabytes(count: int) -> float:
    return count / 1e6


def tool_version(command: list[str]) -> str:
    try:
        run = subprocess.run(command, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return (
        (run.stdout + run.stderr).strip().splitlines()[0] if (run.stdout + run.stderr).strip() else "unknown"
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="chatgate vs a direct nginx upstream and a Python floor: throughput, latency, "
        "streams, memory, workers. Needs nginx, wrk, taskset, aiohttp and matplotlib.",
    )
    speed = parser.add_mutually_exclusive_group()
    speed.add_argument("--quick", action="store_true", help="3 s per point, 20,000 requests for memory")
    speed.add_argument("--smoke", action="store_true", help="1 s per point, four contenders (for tests)")
    parser.add_argument("--seconds", type=float, help="seconds per wrk point (overrides the mode)")
    parser.add_argument("--memory-requests", type=int, help="requests between the RSS readings")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results", help="where latest.* go")
    parser.add_argument("--no-chart", action="store_true", help="skip the PNG (no matplotlib needed)")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a measured goal fails")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    profile = PROFILES["smoke" if args.smoke else "quick" if args.quick else "full"]
    if args.seconds:
        profile = replace(profile, seconds=args.seconds)
    if args.memory_requests is not None:
        profile = replace(profile, memory_requests=args.memory_requests)
    missing = missing_requirements(chart=not args.no_chart)
    if missing:
        print("python -m bench needs, and does not install:\n  " + "\n  ".join(missing), file=sys.stderr)
        return 2
    busy = busy_share()
    if busy > report.BUSY_WARNING:
        print(f"bench: the machine is already {busy:.0%} busy: figures will be noisy", file=sys.stderr)
    cores = Cores.pick()
    if cores.load is None:
        print("bench: one CPU only: nothing is pinned, figures mix server and load", file=sys.stderr)
    else:
        os.sched_setaffinity(0, {int(cores.load)})  # this process runs the stream clients
    started = datetime.datetime.now(datetime.UTC)
    with tempfile.TemporaryDirectory(prefix="chatgate-bench-") as tmp, contextlib.ExitStack() as stack:
        bench = Bench(profile, Path(tmp), cores, stack)
        results = bench.run()
        elapsed = time.monotonic() - bench.started
    results = {
        "meta": {
            "mode": profile.mode,
            "started": started.strftime("%Y-%m-%d %H:%M UTC"),
            "elapsed_s": round(elapsed, 1),
            "seconds_per_point": profile.seconds,
            "memory_requests": profile.memory_requests,
            "cpus": os.cpu_count(),
            "busy_before": round(busy, 3),
            "server_cores": cores.server or "any",
            "load_cores": cores.load or "any",
            "python": sys.version.split()[0],
            "nginx": tool_version(["nginx", "-v"]),
            "wrk": tool_version(["wrk", "-v"]),
            "chatgate_commit": tool_version(["git", "-C", str(ROOT), "describe", "--always", "--dirty"]),
            "request_bytes": len(bench.body),
        },
        **results,
    }
    results["ratios"] = report.evaluate(results)
    print(report.render(results))
    report.write_json(results, args.out / "latest.json")
    written = [str(args.out / "latest.json")]
    if not args.no_chart:
        report.draw_chart(results, args.out / "latest.png")
        written.append(str(args.out / "latest.png"))
    print("written: " + ", ".join(written))
    failed = any(row["verdict"] == "FAIL" for row in results["ratios"])
    return 1 if args.strict and failed else 0
