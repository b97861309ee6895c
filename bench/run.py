"""`python -m bench`: chatgate against a direct nginx upstream and a Python floor, in one run.

Servers run on the first CPU; wrk, the upstream nginx and the stream clients on the second.
Contenders (each a separate process, all started at once and idle when not measured):

  nginx, direct        the upstream itself, answering a fixed chat.completion (and SSE stream)
  Python floor         raw ASGI + chatgate's own upstream client passing bodies through to nginx:
                       what chatgate adds to it is chatgate's own work
  chatgate → nginx     openai-compatible backend; also streams, memory over many requests
  chatgate, echo       the embedded backend: the gateway's own cost without an upstream
  chatgate, policy on  a key (Bearer) and in-memory rate limits too high ever to refuse
  chatgate, tracing on every request traced (a server and a client span), sent by OTLP/HTTP to
                       an nginx location that keeps nothing; and with 1 request in 10 traced
  chatgate, 2 workers  `--workers 2` on both CPUs, against the pinned single worker

The points are measured in rounds, each round taking the contenders in a rotated order, and
each figure is the median over the rounds: a shared machine's speed drifts by tens of percent
within minutes, and interleaving lets the drift fall on every contender alike, so the ratios
stay meaningful.

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
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
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
POOL = {"max_connections": 100}  # the same pool size as the floor's client
RELAY_CONCURRENCY = 32
ALL_CONTENDERS = tuple(report.CONTENDERS)


@dataclass(frozen=True)
class Profile:
    mode: str
    seconds: float  # per wrk point and round
    rounds: int  # each point is measured once per round; the figures are the medians
    warmup: float
    first_chunk_streams: int
    relay_seconds: float
    memory_requests: int
    memory_cap_seconds: float  # sending the memory run's requests stops here whatever the count
    contenders: tuple[str, ...]


PROFILES = {
    "full": Profile("full", 4, 5, 2, 300, 10, 100_000, 300, ALL_CONTENDERS),
    "quick": Profile("quick", 1, 5, 1, 150, 3, 20_000, 120, ALL_CONTENDERS),
    "smoke": Profile("smoke", 1, 1, 1, 20, 1, 500, 10, ("direct", "floor", "upstream", "echo")),
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


@dataclass
class Contender:
    """A server under test, up for the whole run."""

    key: str
    server: Server
    url: str  # the chat completions URL wrk posts to
    stream_url: str  # where its 64-chunk stream is asked for
    headers: dict[str, str] = field(default_factory=dict)
    connections: tuple[int, ...] = report.CONNECTIONS


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

    def start_chatgate(self, name: str, config: dict[str, Any], workers: int = 1, **env: str) -> Server:
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
        return self.start(name, pinned(cores, command), port, answers_health(port), **env)

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

    def warm(self, contender: Contender) -> None:
        headers = {"Content-Type": "application/json", **contender.headers}
        self.check_answer(contender.url, headers)
        self.wrk(contender.server, contender.url, 32, self.profile.warmup, **headers)

    def measure_rounds(self, contenders: dict[str, Contender]) -> dict[str, list[load.WrkResult]]:
        """Every contender's points, round after round in rotated order; medians recorded."""
        runs: dict[str, dict[int, list[tuple[load.WrkResult, float, list[float]]]]] = {
            key: {count: [] for count in contender.connections} for key, contender in contenders.items()
        }
        keys = list(contenders)
        for number in range(self.profile.rounds):
            shift = number % len(keys)
            for key in keys[shift:] + keys[:shift]:
                contender = contenders[key]
                headers = {"Content-Type": "application/json", **contender.headers}
                for count in contender.connections:
                    result, busy, by_process = self.wrk(
                        contender.server, contender.url, count, self.profile.seconds, **headers
                    )
                    runs[key][count].append((result, busy, by_process))
                    errors = f", {result.errors} ERRORS" if result.errors else ""
                    self.say(
                        f"round {number + 1}/{self.profile.rounds} · {report.CONTENDERS[key]}, c={count}: "
                        f"{result.rps:,.0f} req/s, p50 {result.p50_ms:.2f} ms, p99 {result.p99_ms:.2f} ms, "
                        f"cpu {busy:.0%}{errors}"
                    )
        for key, by_count in runs.items():
            points = {str(count): median_point(found) for count, found in by_count.items()}
            self.results["http"][key] = {"label": report.CONTENDERS[key], "points": points, "error": None}
        return {
            key: [result for found in by_count.values() for result, _, _ in found]
            for key, by_count in runs.items()
        }

    def first_chunks(self, sources: dict[str, Contender]) -> None:
        """Sequential streams through each source, in rounds like the HTTP points."""
        times: dict[str, list[float]] = {}
        per_round = max(1, self.profile.first_chunk_streams // self.profile.rounds)
        for source, contender in list(sources.items()):
            try:
                self.check_stream(contender.stream_url, contender.headers)
                times[source] = []
            except Exception as error:
                self.results["streaming"]["errors"][source] = f"{type(error).__name__}: {error}"
                self.say(f"first chunk, {source}: {error}")
        for _ in range(self.profile.rounds):
            for source in times:
                contender = sources[source]
                found = asyncio.run(
                    load.first_chunk_times(
                        contender.stream_url, self.stream_body, headers_for(contender.headers), per_round
                    )
                )
                times[source] += found
        for source, found in times.items():
            result = load.FirstChunkResult.of(found)
            self.results["streaming"]["first_chunk"][source] = result.as_dict()
            self.say(f"first chunk, {source}: p50 {result.p50_ms:.2f} ms, p99 {result.p99_ms:.2f} ms")

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

    def memory_run(self, server: Server, counted: int, rate: float) -> None:
        """Requests through the upstream path until the count is reached, then RSS again."""
        memory = self.results["memory"]
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

    # ----- contenders -----------------------------------------------------------------------

    def launch_direct(self) -> Contender:
        server = self.start_nginx("nginx direct", self.cores.server)
        return Contender("direct", server, server.url + JSON_PATH, server.url + STREAM_PATH)

    def launch_floor(self, key: str = "floor", app: str = "bench.floor:app") -> Contender:
        port = free_port()
        command = [
            sys.executable, "-m", "uvicorn", app, "--port", str(port),
            "--loop", "uvloop", "--http", "httptools", "--lifespan", "on", "--workers", "1",
            "--no-access-log", "--log-level", "warning",
        ]  # fmt: skip
        server = self.start(
            key, pinned(self.cores.server, command), port, accepts_connections(port),
            BENCH_UPSTREAM=self.upstream.url,
        )  # fmt: skip
        return Contender(key, server, server.url + JSON_PATH, server.url + STREAM_PATH)

    def launch_upstream(self) -> Contender:
        """The main contender; also the streams and the memory figures."""
        server = self.start_chatgate("chatgate upstream", self.chatgate_config("openai-compatible"))
        self.results["memory"] = {"idle_mb": megabytes(server.rss_bytes())}
        return Contender("upstream", server, server.url + JSON_PATH, server.url + JSON_PATH)

    def launch_echo(self) -> Contender:
        server = self.start_chatgate("chatgate echo", self.chatgate_config("echo"))
        return Contender("echo", server, server.url + JSON_PATH, server.url + JSON_PATH)

    def launch_policy(self) -> Contender:
        from gateway.policy.auth import new_key

        key, sha256 = new_key()
        server = self.start_chatgate("chatgate policy", self.chatgate_config("openai-compatible", sha256))
        refused = httpx.post(
            server.url + JSON_PATH, content=self.body, headers={"content-type": "application/json"}
        )
        if refused.status_code != 401:
            raise RuntimeError(f"policy is not on: a request without a key got {refused.status_code}")
        headers = {"Authorization": f"Bearer {key}"}
        return Contender("policy", server, server.url + JSON_PATH, server.url + JSON_PATH, headers)

    def launch_traced(self, key: str = "traced", sample_ratio: float = 1.0) -> Contender:
        tracing = {"enabled": True, "sample_ratio": sample_ratio}
        config = {**self.chatgate_config("openai-compatible"), "tracing": tracing}
        server = self.start_chatgate(
            f"chatgate {key}", config, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=f"{self.upstream.url}/v1/traces"
        )
        return Contender(key, server, server.url + JSON_PATH, server.url + JSON_PATH)

    def launch_workers(self) -> Contender:
        server = self.start_chatgate(
            "chatgate 2 workers", self.chatgate_config("openai-compatible"), workers=2
        )
        url = server.url + JSON_PATH
        return Contender("workers2", server, url, url, connections=(32,))

    def launch(self, key: str, how: Callable[[], Contender]) -> Contender | None:
        """Start and warm a contender; a failure is recorded against it and the run goes on."""
        try:
            contender = how()
            self.warm(contender)
            if key == "upstream":
                self.results["memory"]["warm_mb"] = megabytes(contender.server.rss_bytes())
        except Exception as error:
            message = f"{type(error).__name__}: {error}"
            self.results["http"][key] = {"label": report.CONTENDERS[key], "points": {}, "error": message}
            self.say(f"{report.CONTENDERS[key]}: {message}")
            return None
        self.say(f"{report.CONTENDERS[key]}: up")
        return contender

    def run(self) -> dict[str, Any]:
        self.upstream = self.start_nginx("nginx upstream", self.cores.load)
        check = httpx.post(self.upstream.url + JSON_PATH, content=self.body)
        if check.status_code != 200:
            raise RuntimeError(f"the nginx upstream answered {check.status_code}: {self.upstream.log_tail()}")
        launchers = {
            "direct": self.launch_direct,
            "floor": self.launch_floor,
            "upstream": self.launch_upstream,
            "echo": self.launch_echo,
            "policy": self.launch_policy,
            "traced": self.launch_traced,
            "sampled": lambda: self.launch_traced("sampled", 0.1),
            "workers2": self.launch_workers,
        }
        contenders = {}
        for key, how in launchers.items():
            if key in self.profile.contenders and (contender := self.launch(key, how)):
                contenders[key] = contender
        runs = self.measure_rounds(contenders)
        streamers = {"direct": "direct", "floor": "floor", "upstream": "chatgate"}
        self.first_chunks({name: contenders[key] for key, name in streamers.items() if key in contenders})
        upstream = contenders.get("upstream")
        if upstream is None:
            return self.results
        for key, contender in contenders.items():
            if key != "upstream":
                contender.server.stop()  # the rest runs on the upstream path alone
        try:
            self.check_stream(upstream.url, {})
            self.relay(upstream.server)
        except Exception as error:
            self.results["streaming"]["errors"]["relay"] = f"{type(error).__name__}: {error}"
            self.say(f"relay: {error}")
        counted = sum(run.requests for run in runs["upstream"])
        try:
            self.memory_run(upstream.server, counted, max(runs["upstream"][-1].rps, 1.0))
        except Exception as error:
            self.results["memory"]["error"] = f"{type(error).__name__}: {error}"
            self.say(f"memory: {error}")
        return self.results


def median_point(found: list[tuple[load.WrkResult, float, list[float]]]) -> dict[str, Any]:
    """One point's figures over the rounds: the median of each; requests and errors summed."""
    results = [result for result, _, _ in found]
    point: dict[str, Any] = {
        "connections": results[0].connections,
        "requests": sum(r.requests for r in results),
        "seconds": round(sum(r.seconds for r in results), 3),
        "errors": sum(r.errors for r in results),
        "rounds": len(results),
        "rps_by_round": [round(r.rps, 1) for r in results],
    }
    for name in ("rps", "p50_ms", "p90_ms", "p99_ms"):
        point[name] = statistics.median(getattr(r, name) for r in results)
    point["server_cpu"] = statistics.median(busy for _, busy, _ in found)
    by_process = [shares for _, _, shares in found if len(shares) > 1]
    if by_process:
        columns = zip(*by_process, strict=False)
        point["server_cpu_by_process"] = [statistics.median(column) for column in columns]
    return point


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
    speed.add_argument(
        "--quick", action="store_true", help="5 rounds of 1 s per point, 20,000 requests for memory"
    )
    speed.add_argument(
        "--smoke", action="store_true", help="one round of 1 s per point, five contenders (for tests)"
    )
    parser.add_argument("--seconds", type=float, help="seconds per wrk point and round (overrides the mode)")
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
            "rounds": profile.rounds,
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
