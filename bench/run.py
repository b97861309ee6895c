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
  chatgate, Messages   the same deployments asked in Anthropic's Messages dialect, and in
  chatgate, Responses  OpenAI's Responses dialect (bench/dialects.py): CPU per request at c=32
                       and per chunk of a stream relayed, each against chat completions' in
                       paired rounds on the chat row's chatgate, asked in each dialect
  Portkey gateway      a peer: Portkey's open-source gateway 1.15.2 (Node, npm, pinned by
                       bench/portkey/package-lock.json, installed on first use), forwarding to
                       the same nginx upstream
  LiteLLM proxy        a peer: LiteLLM 1.80.0 in a venv of its own (made on first use), one
                       model on the same nginx upstream

The peers run in the full mode (--no-peers leaves them out); --quick and --smoke run them only
when asked (--with-portkey, --with-litellm). The peer table puts chatgate's req/s against each
peer's and the floor's, with each goal's verdict.

Then the concurrency point (bench/concurrency.py): 1,000, 4,000 and 8,000 slow streams open at
once (64 chunks 20 ms apart, bench/slow_upstream.py) through one worker, each count on a fresh
chatgate: errors, CPU per chunk, RSS per open stream, RSS after, the added p99 gap between
chunks; then the same streams through a fresh floor (bench/floor.py with no cap on its upstream
connections), the least such a relay costs in Python. `--only-concurrency` runs just that point
(it needs neither nginx nor wrk).

Last, the fleet point (bench/fleet.py; the full run, or --with-fleet; `--only-fleet` alone):
two llama.cpp server replicas and a workload of tenants with long shared prefixes, routed
round-robin, by today's P2C, on the servers' /metrics, and with prefix affinity: time to first
token p50/p90 and output tokens/s of each.

The points are measured in rounds, each round taking the contenders in a rotated order, and
each figure is the median over the rounds: a shared machine's speed drifts by tens of percent
within minutes, and interleaving lets the drift fall on every contender alike, so the ratios
stay meaningful. After the points at full speed come two at a capped rate, also in rounds:
latency at half the floor's maximum rate (nginx, the floor and chatgate at the same rate), and
1 worker against 2 at 70 % of 1 worker's maximum (CPU per request, connections per worker).

It installs nothing into chatgate's environment: it says what is missing and stops. Results: a
table on stdout, <out>/latest.json and <out>/latest.png; `--show` prints a saved run again.
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
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import orjson
import yaml

from bench import concurrency, fleet, litellm_proxy, load, portkey_gateway, report
from bench.dialects import CHAT, DIALECTS, MESSAGES, RESPONSES, Dialect
from bench.processes import (
    START_TIMEOUT,
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
CAPPED_CONNECTIONS = 32
LATENCY_RATE_SHARE = 0.5  # the latency figures' rate: half the floor's maximum (c=32)
WORKERS_RATE_SHARE = 0.7  # the scale-out figures' rate: 70 % of 1 worker's maximum (c=32)
PEERS = ("portkey", "litellm")  # installed on first use, outside chatgate's environment
ALL_CONTENDERS = tuple(key for key in report.CONTENDERS if key not in PEERS)


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
    capped_seconds: float  # per capped-rate point and round
    contenders: tuple[str, ...]
    concurrent_streams: tuple[int, ...] = concurrency.STREAMS  # the concurrency point's counts
    peers: tuple[str, ...] = ()  # run unless --no-peers; the others only when asked
    fleet: bool = False  # the fleet point (minutes; needs llama-server): the full run's, or asked
    dialect_rounds: int = 12  # paired rounds of the dialects' CPU per request (`dialect_requests`)


PROFILES = {
    "full": Profile("full", 4, 5, 2, 300, 10, 100_000, 300, 4, ALL_CONTENDERS, peers=PEERS, fleet=True),
    "quick": Profile("quick", 1, 5, 1, 150, 3, 20_000, 120, 2, ALL_CONTENDERS, dialect_rounds=6),
    "smoke": Profile(
        "smoke",
        1,
        1,
        1,
        20,
        1,
        500,
        10,
        1,
        ("direct", "floor", "upstream", "echo", "workers2", "messages", "responses"),
        concurrency.SMOKE_STREAMS,
        dialect_rounds=1,
    ),
}
# The concurrency point's deployment: one replica that takes every stream at once (the slow
# upstream is no engine with a batch size); --concurrency-settings replaces it.
CONCURRENCY_SETTINGS: dict[str, Any] = {"concurrency": {"max_concurrent": 20_000}}
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
    url: str  # the URL wrk posts to (chat completions unless `dialect` says otherwise)
    stream_url: str  # where its 64-chunk stream is asked for
    headers: dict[str, str] = field(default_factory=dict)
    connections: tuple[int, ...] = report.CONNECTIONS
    workers: int = 1  # with more, every wrk run also counts the connections each one holds
    dialect: Dialect = CHAT  # what its requests look like

    @property
    def body(self) -> bytes:
        return orjson.dumps(self.dialect.request)

    @property
    def stream_body(self) -> bytes:
        return orjson.dumps(self.dialect.stream_request)


@dataclass(frozen=True)
class Load:
    """What wrk sends in one point: so many connections, as fast as answered or at a rate."""

    connections: int
    rate: float | None = None


@dataclass(frozen=True)
class Sample:
    """One wrk run against one contender, and what its server spent on it."""

    result: load.WrkResult
    busy: float  # the server's CPU time / wall time, all its processes (1.0 = one core)
    by_process: list[float]  # the same per process, busiest first
    cpu_us_per_request: float
    connections_by_worker: list[int] | None = None  # counted halfway through, when asked


class Bench:
    """One run: owns the temporary directory, the upstream and the results."""

    def __init__(
        self,
        profile: Profile,
        tmp: Path,
        cores: Cores,
        stack: contextlib.ExitStack,
        peers: tuple[str, ...] = (),
        chatgate_root: Path = ROOT,
        concurrency_settings: dict[str, Any] | None = None,
    ) -> None:
        self.profile = profile
        self.chatgate_root = chatgate_root  # the checkout the concurrency point's chatgate runs
        self.concurrency_settings = (
            CONCURRENCY_SETTINGS if concurrency_settings is None else concurrency_settings
        )
        self.tmp = tmp
        self.cores = cores
        self.stack = stack
        self.peers = peers
        self.started = time.monotonic()
        self.body = orjson.dumps(REQUEST)
        self.stream_body = orjson.dumps(STREAM_REQUEST)
        self.running: dict[str, Contender] = {}  # the contenders up, by key
        self.served: Counter[str] = Counter()  # requests each contender answered under load
        self.results: dict[str, Any] = {
            "http": {},
            "capped": {},
            "streaming": {"first_chunk": {}, "errors": {}},
            "dialects": {"requests": {}, "streams": {}, "errors": {}},
        }

    # ----- plumbing -------------------------------------------------------------------------

    def say(self, message: str) -> None:
        print(f"[{time.monotonic() - self.started:5.0f} s] {message}", file=sys.stderr, flush=True)

    def start(
        self, name: str, command: list[str], port: int, ready: Callable[[], bool], **env: str
    ) -> Server:
        """A server run from the checkout, with chatgate's packages on its path."""
        return self.start_in(name, command, port, ready, {**os.environ, "PYTHONPATH": str(ROOT), **env})

    def start_in(
        self,
        name: str,
        command: list[str],
        port: int,
        ready: Callable[[], bool],
        environment: dict[str, str],
        cwd: Path = ROOT,
        timeout: float = START_TIMEOUT,
    ) -> Server:
        log = self.tmp / f"{name.replace(' ', '-')}-{port}.log"
        server = start_server(name, command, port, log, ready, cwd=cwd, env=environment, timeout=timeout)
        self.stack.callback(server.stop)
        return server

    def start_nginx(self, name: str, cores: str | None) -> Server:
        port = free_port()
        conf = write_nginx_files(self.tmp, port)
        return self.start(name, pinned(cores, nginx_command(self.tmp, conf)), port, accepts_connections(port))

    def start_chatgate(
        self, name: str, config: dict[str, Any], workers: int = 1, root: Path = ROOT, **env: str
    ) -> Server:
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
        if root == ROOT:
            return self.start(name, pinned(cores, command), port, answers_health(port), **env)
        environment = {**os.environ, "PYTHONPATH": str(root), **env}
        return self.start_in(name, pinned(cores, command), port, answers_health(port), environment, root)

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

    def check_answer(self, contender: Contender) -> None:
        """One request by hand before any load: a 200 with generated text, so wrk counts real work."""
        url = contender.url
        response = httpx.post(url, content=contender.body, headers=headers_for(contender.headers))
        if response.status_code != 200:
            raise RuntimeError(f"{url} answered {response.status_code}: {response.text[:300]}")
        if not contender.dialect.text(response.json()):
            raise RuntimeError(f"{url} answered without generated text")

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

    def wrk(self, contender: Contender, load_: Load, seconds: float) -> Sample:
        """A wrk run and the server's CPU time over it; for several workers, the connections
        each one holds, counted halfway through the run."""
        server = contender.server
        headers = {"Content-Type": "application/json", **contender.headers}
        cpu, started = server.cpu_by_process(), time.monotonic()
        run = load.WrkRun(
            contender.url, contender.body, headers, load_.connections, seconds, self.cores.load, load_.rate
        )
        by_worker = None
        if contender.workers > 1:
            time.sleep(run.seconds / 2)
            by_worker = server.connections_by_worker()
        result = run.result()
        elapsed = time.monotonic() - started
        spent = {pid: used - cpu.get(pid, 0.0) for pid, used in server.cpu_by_process().items()}
        self.served[contender.key] += result.requests
        return Sample(
            result=result,
            busy=sum(spent.values()) / elapsed,
            by_process=sorted((used / elapsed for used in spent.values()), reverse=True),
            cpu_us_per_request=sum(spent.values()) / result.requests * 1e6 if result.requests else 0.0,
            connections_by_worker=by_worker,
        )

    def warm(self, contender: Contender) -> None:
        self.check_answer(contender)
        self.wrk(contender, Load(32), self.profile.warmup)

    def rounds(
        self, plan: dict[str, tuple[Contender, list[Load]]], seconds: float, what: str
    ) -> dict[str, list[list[Sample]]]:
        """Every contender's loads, round after round in rotated order: per contender, per load,
        the samples of the rounds."""
        samples: dict[str, list[list[Sample]]] = {
            key: [[] for _ in loads] for key, (_, loads) in plan.items()
        }
        keys = list(plan)
        for number in range(self.profile.rounds):
            shift = number % len(keys)
            for key in keys[shift:] + keys[:shift]:
                contender, loads = plan[key]
                for index, load_ in enumerate(loads):
                    sample = self.wrk(contender, load_, seconds)
                    samples[key][index].append(sample)
                    self.say(f"{what} {number + 1}/{self.profile.rounds} · {describe(contender, sample)}")
        return samples

    def measure_rounds(self, contenders: dict[str, Contender]) -> None:
        """Every contender's points at full speed (c=1, c=32); medians recorded."""
        plan = {key: (c, [Load(count) for count in c.connections]) for key, c in contenders.items()}
        samples = self.rounds(plan, self.profile.seconds, "round")
        for key, by_load in samples.items():
            points = {str(found[0].result.connections): median_point(found) for found in by_load}
            self.results["http"][key] = {"label": report.CONTENDERS[key], "points": points, "error": None}

    def measure_capped(self, section: str, keys: tuple[str, ...], basis: str, share: float) -> None:
        """The contenders `keys` at one capped rate: `share` of `basis`'s maximum (its c=32 req/s,
        measured in the rounds before)."""
        maximum = report.figure(self.results, basis, 32, "rps")
        if maximum is None:
            why = f"no rate to cap at: {report.CONTENDERS[basis]} has no figure at c=32"
            self.results["capped"][section] = {"error": why}
            self.say(f"capped load, {section}: {why}")
            return
        rate = maximum * share
        self.say(f"capped load, {section}: {rate:,.0f} req/s ({share:.0%} of {basis}'s {maximum:,.0f})")
        load_ = Load(CAPPED_CONNECTIONS, rate)
        plan = {key: (self.running[key], [load_]) for key in keys if key in self.running}
        by_load = self.rounds(plan, self.profile.capped_seconds, section)
        samples = {key: found[0] for key, found in by_load.items()}
        entry: dict[str, Any] = {
            "rate": rate,
            "basis": {"of": basis, "rps": maximum, "share": share},
            "connections": CAPPED_CONNECTIONS,
            "seconds": self.profile.capped_seconds,
            "rounds": self.profile.rounds,
            "points": {key: median_point(found) for key, found in samples.items()},
        }
        counted = [sample.connections_by_worker for sample in samples.get("workers2", ())]
        if any(counted):
            entry["connections_by_worker"] = [counts or [] for counts in counted]
        for key, figures in entry["points"].items():
            missed = report.rate_missed_by(figures)
            if abs(missed) > report.RATE_TOLERANCE:
                self.say(f"capped load, {section}: {key} missed the rate by {missed:+.1%}: NOT A FIGURE")
        self.results["capped"][section] = entry

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

    def check_dialect_stream(self, contender: Contender) -> None:
        """One stream by hand: a 200 that ends with the dialect's last event."""
        url, headers = contender.stream_url, headers_for(contender.headers)
        with httpx.stream("POST", url, content=contender.stream_body, headers=headers) as response:
            raw = response.read()
        if response.status_code != 200 or contender.dialect.done not in raw[-4096:]:
            raise RuntimeError(f"{contender.stream_url} streamed {response.status_code}: {raw[-300:]!r}")

    def dialect_sources(self) -> dict[str, Contender]:
        """The chat row's chatgate, asked in each dialect whose own row runs (the dialect rows
        share its config): the dialects' paired rounds compare one process with itself."""
        if (chat := self.running.get("upstream")) is None:
            return {}
        sources = {"chat": chat}
        for name, dialect in DIALECTS.items():
            if name != "chat" and dialect.key in self.running:
                url = chat.server.url + dialect.path
                sources[name] = replace(chat, url=url, stream_url=url, dialect=dialect)
        return sources

    def dialect_requests(self) -> None:
        """CPU per request at c=32 of each dialect against chat completions', in paired rounds on
        one chatgate (`dialect_sources`): a round asks it in every dialect back to back (in a
        rotated order), and a dialect's figure is the median over the rounds of its CPU per
        request over chat's in the same round.

        The contender table's dialect rows are other processes, measured up to a minute apart
        from chat's among ten other contenders, and on this machine one point's CPU per request
        moves by a fifth from one round to the next: the table could not tell 1.10× from 1.00×.
        One process asked in each dialect seconds apart, many times, can, and nothing but the
        dialect differs between the figures compared (issue 40)."""
        sources = self.dialect_sources()
        if len(sources) < 2:
            return
        try:
            for contender in sources.values():
                self.check_answer(contender)
        except Exception as error:
            self.results["dialects"]["errors"]["requests"] = f"{type(error).__name__}: {error}"
            self.say(f"dialect requests: {error}")
            return
        seconds = max(1.0, self.profile.seconds / 2)
        found: dict[str, list[Sample]] = {name: [] for name in sources}
        names = list(sources)
        for number in range(self.profile.dialect_rounds):
            shift = number % len(names)
            for name in names[shift:] + names[:shift]:
                found[name].append(self.wrk(sources[name], Load(32), seconds))
            figures = (f"{name} {taken[-1].cpu_us_per_request:.0f} µs/req" for name, taken in found.items())
            self.say(f"dialect requests {number + 1}/{self.profile.dialect_rounds}: {', '.join(figures)}")
        self.results["dialects"]["requests"] = paired_dialect_figures(found, seconds)

    def dialect_streams(self) -> None:
        """32 streams at once in each dialect on one chatgate (`dialect_sources`), in rotated
        rounds: the CPU it spent per stream and per chunk of the upstream's stream (the same 64
        chunks whatever the dialect writes of them), the medians over the rounds, and each
        dialect's per-round ratio to chat's."""
        sources: dict[str, Contender] = {}
        for name, contender in self.dialect_sources().items():
            try:
                self.check_dialect_stream(contender)
                sources[name] = contender
            except Exception as error:
                self.results["dialects"]["errors"][name] = f"{type(error).__name__}: {error}"
                self.say(f"dialect streams, {name}: {error}")
        if "chat" not in sources or len(sources) < 2:
            return
        seconds = max(1.0, self.profile.relay_seconds / self.profile.rounds)
        samples: dict[str, list[tuple[load.RelayResult, float]]] = {name: [] for name in sources}
        names = list(sources)
        for number in range(self.profile.rounds):
            shift = number % len(names)
            for name in names[shift:] + names[:shift]:
                contender = sources[name]
                cpu = contender.server.cpu_seconds()
                found = asyncio.run(
                    load.relay_rate(
                        contender.stream_url, contender.stream_body, headers_for(contender.headers),
                        RELAY_CONCURRENCY, seconds, contender.dialect.done,
                    )
                )  # fmt: skip
                spent = contender.server.cpu_seconds() - cpu
                samples[name].append((found, spent))
                per_stream = spent / found.streams * 1e6 if found.streams else 0.0
                self.say(
                    f"dialect streams {number + 1}/{self.profile.rounds} · {name}: {found.streams} streams, "
                    f"{per_stream:,.0f} µs cpu/stream, {per_stream / STREAM_CHUNKS:.1f} µs/chunk, "
                    f"{found.errors} errors"
                )
        chat = samples["chat"]
        for name, found in samples.items():
            figures = dialect_stream_figures(found, seconds)
            if name != "chat":
                figures.update(over_chat(per_stream_by_round(found), per_stream_by_round(chat)))
            self.results["dialects"]["streams"][name] = figures

    def relay(self, server: Server) -> None:
        """32 streams at once through chatgate for `relay_seconds`, in the profile's rounds:
        chunks per core-second is the rounds' median (one run of 3 s read from 48k to 62k for
        the same code), the other figures are the rounds' together."""
        url = server.url + JSON_PATH
        seconds = max(1.0, self.profile.relay_seconds / self.profile.rounds)
        rounds: list[tuple[load.RelayResult, float, float]] = []
        for number in range(self.profile.rounds):
            cpu, started = server.cpu_seconds(), time.monotonic()
            found = asyncio.run(
                load.relay_rate(url, self.stream_body, headers_for(None), RELAY_CONCURRENCY, seconds)
            )
            rounds.append((found, server.cpu_seconds() - cpu, time.monotonic() - started))
            self.say(
                f"relay {number + 1}/{self.profile.rounds}: {found.chunks_per_s:,.0f} chunks/s "
                f"({found.streams} streams, client cpu {found.client_cpu:.0%}, {found.errors} errors)"
            )
        relay = relay_figures(rounds)
        self.results["streaming"]["relay"] = relay
        self.say(
            f"relay: {relay['chunks_per_core_s'] or 0:,.0f} chunks per core-second (median of "
            f"{len(rounds)}), cpu {relay['server_cpu']:.0%}, {relay['errors']} errors"
        )

    def memory_run(self, upstream: Contender, rate: float) -> None:
        """Requests through the upstream path until the count since warm-up is reached (those of
        the rounds count), then RSS again."""
        memory = self.results["memory"]
        server = upstream.server
        deadline = time.monotonic() + self.profile.memory_cap_seconds
        counted = self.served[upstream.key]
        while counted < self.profile.memory_requests and time.monotonic() < deadline:
            # wrk has no request count: run it for the time the rest should take, until reached
            remaining = self.profile.memory_requests - counted
            seconds = min(math.ceil(remaining / rate), max(1, deadline - time.monotonic()))
            self.say(f"memory: {remaining:,} more requests to reach {self.profile.memory_requests:,}")
            more = self.wrk(upstream, Load(32), seconds).result
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

    def concurrency_point(self) -> None:
        """The slow streams at each count: straight from the slow upstream, then through a
        fresh chatgate (so its RSS before is that of an idle worker), then through a fresh floor
        (the same streams' least cost in Python)."""
        counts = self.profile.concurrent_streams
        concurrency.raise_open_files(2 * max(counts) + 1024)
        port = free_port()
        command = [sys.executable, "-m", "bench.slow_upstream", str(port), str(concurrency.GAP_MS)]
        slow = self.start("slow upstream", pinned(self.cores.load, command), port, accepts_connections(port))
        entry: dict[str, Any] = {
            "gap_ms": concurrency.GAP_MS,
            "chunks_per_stream": STREAM_CHUNKS,
            "settings": self.concurrency_settings,
            "chatgate_root": str(self.chatgate_root),
            "points": {},
        }
        self.results["concurrency"] = entry
        for count in counts:
            direct = asyncio.run(concurrency.streams_at_once(slow.url + JSON_PATH, self.stream_body, count))
            self.say(
                f"concurrency {count:,}, direct: {direct.errors} errors, gap p99 {direct.gap_p99_ms:.1f} ms, "
                f"client cpu {direct.client_cpu:.0%}"
            )
            point: dict[str, Any] = {"direct": direct.as_dict()}
            entry["points"][str(count)] = point
            for name, launch in (("chatgate", self.concurrency_chatgate), ("floor", self.concurrency_floor)):
                try:
                    point[name] = self.streams_through(name, launch(slow.url, count), count, direct)
                except Exception as error:
                    point.setdefault("error", f"{name}: {type(error).__name__}: {error}")
                    self.say(f"concurrency {count:,}, {name}: {type(error).__name__}: {error}")
        slow.stop()

    def concurrency_chatgate(self, upstream_url: str, count: int) -> Server:
        deployment = {
            "name": STREAM_REQUEST["model"],
            "backend": "openai-compatible",
            **self.concurrency_settings,
        }
        deployment["options"] = {"base_url": f"{upstream_url}/v1", **deployment.get("options", {})}
        config = {
            "server": {"clients": {"max_connections": count + 1000}},
            "deployments": [deployment],
        }
        server = self.start_chatgate(f"chatgate concurrency {count}", config, root=self.chatgate_root)
        try:
            self.check_stream(server.url + JSON_PATH, {})
        except BaseException:
            server.stop()
            raise
        return server

    def concurrency_floor(self, upstream_url: str, count: int) -> Server:
        """bench.floor with no cap on its upstream connections, and a listen backlog as deep as
        chatgate's for the same count."""
        port = free_port()
        command = [
            sys.executable, "-m", "uvicorn", "bench.floor:app", "--port", str(port),
            "--loop", "uvloop", "--http", "httptools", "--lifespan", "on", "--workers", "1",
            "--no-access-log", "--log-level", "warning", "--backlog", str(count + 1000),
        ]  # fmt: skip
        return self.start(
            f"floor concurrency {count}", pinned(self.cores.server, command), port, accepts_connections(port),
            BENCH_UPSTREAM=upstream_url, BENCH_MAX_CONNECTIONS="0",
        )  # fmt: skip

    def streams_through(
        self, name: str, server: Server, count: int, direct: concurrency.StreamsResult
    ) -> dict[str, Any]:
        """`count` slow streams through `server` (fresh, one worker), then `server` stopped: its
        CPU per chunk relayed and its RSS before, at the peak, per open stream and after."""
        try:
            before, cpu = server.rss_bytes(), server.cpu_seconds()
            peak = {"rss": before, "open": 0, "rss_at_most_open": before}

            def sample(open_streams: int) -> None:
                rss = server.rss_bytes()
                peak["rss"] = max(peak["rss"], rss)
                if open_streams >= peak["open"]:  # the memory the most streams open at once held
                    peak.update(open=open_streams, rss_at_most_open=rss)

            found = asyncio.run(
                concurrency.streams_at_once(server.url + JSON_PATH, self.stream_body, count, sample)
            )
            spent = server.cpu_seconds() - cpu
            time.sleep(concurrency.SETTLE_SECONDS)
            after = server.rss_bytes()
        finally:
            server.stop()
        figures = {
            **found.as_dict(),
            "cpu_us_per_chunk": spent / found.chunks * 1e6 if found.chunks else None,
            "rss_before_mb": megabytes(before),
            "rss_peak_mb": megabytes(peak["rss"]),
            "most_open_sampled": peak["open"],
            "rss_kb_per_open_stream": (peak["rss_at_most_open"] - before) / peak["open"] / 1e3
            if peak["open"]
            else None,
            "rss_after_mb": megabytes(after),
            # against a direct run that kept the pace (else the load core, not chatgate, set it)
            "added_gap_p99_ms": found.gap_p99_ms - direct.gap_p99_ms
            if direct.gap_p99_ms <= concurrency.AT_PACE * concurrency.GAP_MS
            else None,
        }
        self.say(
            f"concurrency {count:,}, {name}: {found.errors} errors {found.error_kinds or ''}, "
            f"{figures['cpu_us_per_chunk'] or 0:.1f} µs cpu/chunk, RSS {figures['rss_before_mb']:.0f} → "
            f"{figures['rss_peak_mb']:.0f} MB ({peak['open']:,} open at most) → "
            f"{figures['rss_after_mb']:.0f} MB after, "
            f"gap p99 {found.gap_p99_ms:.1f} ms (direct {direct.gap_p99_ms:.1f}), "
            f"client cpu {found.client_cpu:.0%}"
        )
        return figures

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
        return Contender("workers2", server, url, url, connections=(32,), workers=2)

    def launch_dialect(self, dialect: Dialect) -> Contender:
        """chatgate → nginx as the chat row's, asked in another dialect (c=32 only)."""
        server = self.start_chatgate(f"chatgate {dialect.key}", self.chatgate_config("openai-compatible"))
        url = server.url + dialect.path
        return Contender(dialect.key, server, url, url, connections=(32,), dialect=dialect)

    def launch_portkey(self) -> Contender:
        """Portkey's gateway on the server CPU, installed first if need be; wrk's headers send
        each request to the nginx upstream."""
        start_server = portkey_gateway.ensure_installed(self.say)
        port = free_port()
        command = portkey_gateway.command(start_server, port)
        environment = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "NODE_OPTIONS")}
        server = self.start_in(
            "Portkey", pinned(self.cores.server, command), port, accepts_connections(port),
            {**environment, **portkey_gateway.ENVIRONMENT}, cwd=self.tmp,
            timeout=portkey_gateway.START_TIMEOUT,
        )  # fmt: skip
        headers = portkey_gateway.headers(f"{self.upstream.url}/v1")
        return Contender("portkey", server, server.url + JSON_PATH, server.url + JSON_PATH, headers)

    def launch_litellm(self) -> Contender:
        """LiteLLM's proxy on the server CPU, its venv made first if need be."""
        executable = litellm_proxy.ensure_installed(self.say)
        port = free_port()
        config = self.tmp / f"litellm-{port}.yaml"
        config.write_text(yaml.safe_dump(litellm_proxy.config(REQUEST["model"], f"{self.upstream.url}/v1")))
        logging_config = self.tmp / "litellm-logging.json"
        logging_config.write_bytes(orjson.dumps(litellm_proxy.LOGGING))
        command = litellm_proxy.command(executable, config, logging_config, port)
        environment = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        server = self.start_in(
            "LiteLLM", pinned(self.cores.server, command), port, accepts_connections(port),
            {**environment, **litellm_proxy.ENVIRONMENT}, cwd=self.tmp, timeout=litellm_proxy.START_TIMEOUT,
        )  # fmt: skip
        return Contender("litellm", server, server.url + JSON_PATH, server.url + JSON_PATH)

    def launch(self, key: str, how: Callable[[], Contender]) -> Contender | None:
        """Start and warm a contender; a failure is recorded against it and the run goes on."""
        try:
            contender = how()
            self.warm(contender)
            if key == "upstream":
                self.results["memory"]["warm_mb"] = megabytes(contender.server.rss_bytes())
                self.served[key] = 0  # the memory run counts from here
        except Exception as error:
            message = f"{type(error).__name__}: {error}"
            self.results["http"][key] = {"label": report.CONTENDERS[key], "points": {}, "error": message}
            self.say(f"{report.CONTENDERS[key]}: {message}")
            return None
        self.say(f"{report.CONTENDERS[key]}: up")
        return contender

    def fleet_point(self) -> None:
        workload = fleet.QUICK if self.profile.mode == "smoke" else fleet.Workload()
        try:
            self.results["fleet"] = fleet.fleet_point(
                self.tmp, lambda name, config: self.start_chatgate(name, config), self.say, workload
            )
        except Exception as error:
            self.results["fleet"] = {"error": f"{type(error).__name__}: {error}"}
            self.say(f"fleet: {error}")

    def run(self, only_concurrency: bool = False, only_fleet: bool = False) -> dict[str, Any]:
        if only_concurrency or only_fleet:
            if only_concurrency:
                self.concurrency_point()
            if only_fleet:
                self.fleet_point()
            return self.results
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
            "messages": lambda: self.launch_dialect(MESSAGES),
            "responses": lambda: self.launch_dialect(RESPONSES),
            "portkey": self.launch_portkey,
            "litellm": self.launch_litellm,
        }
        wanted = self.profile.contenders + self.peers
        for key, how in launchers.items():
            if key in wanted and (contender := self.launch(key, how)):
                self.running[key] = contender
        self.measure_rounds(self.running)
        self.measure_capped("latency", ("direct", "floor", "upstream"), "floor", LATENCY_RATE_SHARE)
        if "workers2" in wanted:
            self.measure_capped("workers", ("upstream", "workers2"), "upstream", WORKERS_RATE_SHARE)
        streamers = {"direct": "direct", "floor": "floor", "upstream": "chatgate"}
        self.first_chunks({name: self.running[key] for key, name in streamers.items() if key in self.running})
        self.dialect_requests()
        self.dialect_streams()
        upstream = self.running.get("upstream")
        if upstream is None:
            return self.results
        for key, contender in self.running.items():
            if key != "upstream":
                contender.server.stop()  # the rest runs on the upstream path alone
        try:
            self.check_stream(upstream.url, {})
            self.relay(upstream.server)
        except Exception as error:
            self.results["streaming"]["errors"]["relay"] = f"{type(error).__name__}: {error}"
            self.say(f"relay: {error}")
        try:
            self.memory_run(upstream, max(report.figure(self.results, "upstream", 32, "rps") or 1.0, 1.0))
        except Exception as error:
            self.results["memory"]["error"] = f"{type(error).__name__}: {error}"
            self.say(f"memory: {error}")
        upstream.server.stop()
        try:
            self.concurrency_point()
        except Exception as error:
            self.results["concurrency"] = {"error": f"{type(error).__name__}: {error}"}
            self.say(f"concurrency: {error}")
        if self.profile.fleet:
            self.fleet_point()
        return self.results


def median_point(samples: list[Sample]) -> dict[str, Any]:
    """One point's figures over the rounds: the median of each; requests and errors summed."""
    results = [sample.result for sample in samples]
    point: dict[str, Any] = {
        "connections": results[0].connections,
        "rate": results[0].rate,
        "requests": sum(r.requests for r in results),
        "seconds": round(sum(r.seconds for r in results), 3),
        "errors": sum(r.errors for r in results),
        "rounds": len(results),
        "rps_by_round": [round(r.rps, 1) for r in results],
    }
    for name in ("rps", "p50_ms", "p90_ms", "p99_ms"):
        point[name] = statistics.median(getattr(r, name) for r in results)
    point["server_cpu"] = statistics.median(sample.busy for sample in samples)
    point["cpu_us_per_request"] = statistics.median(sample.cpu_us_per_request for sample in samples)
    by_process = [sample.by_process for sample in samples if len(sample.by_process) > 1]
    if by_process:
        columns = zip(*by_process, strict=False)
        point["server_cpu_by_process"] = [statistics.median(column) for column in columns]
    return point


def paired_dialect_figures(found: dict[str, list[Sample]], seconds: float) -> dict[str, Any]:
    """Each dialect's CPU per request over the paired rounds (`found[name][k]` is round k's
    sample): its median, and, beside chat's, the median of the rounds' ratios to chat's."""
    chat = [sample.cpu_us_per_request for sample in found["chat"]]
    figures: dict[str, Any] = {}
    for name, samples in found.items():
        per_request = [sample.cpu_us_per_request for sample in samples]
        entry: dict[str, Any] = {
            "rounds": len(samples),
            "seconds": seconds,
            "connections": 32,
            "requests": sum(sample.result.requests for sample in samples),
            "errors": sum(sample.result.errors for sample in samples),
            "cpu_us_per_request": statistics.median(per_request),
            "cpu_us_by_round": [round(value, 1) for value in per_request],
        }
        if name != "chat":
            entry.update(over_chat(per_request, chat))
        figures[name] = entry
    return figures


def over_chat(mine: list[float | None], chat: list[float | None]) -> dict[str, Any]:
    """A dialect's figures over chat's, round by round (the rounds where both have one), and
    the median of those ratios: the dialects' verdicts (`dialect_requests`, `dialect_streams`)."""
    ratios = [ours / theirs for ours, theirs in zip(mine, chat, strict=True) if ours is not None and theirs]
    return {
        "over_chat_by_round": [round(value, 3) for value in ratios],
        "over_chat": statistics.median(ratios) if ratios else None,
    }


def per_stream_by_round(samples: list[tuple[load.RelayResult, float]]) -> list[float | None]:
    """CPU seconds per stream in each round of the dialects' streams (None: no stream ended)."""
    return [spent / found.streams if found.streams else None for found, spent in samples]


def dialect_stream_figures(samples: list[tuple[load.RelayResult, float]], seconds: float) -> dict[str, Any]:
    """One dialect's streams over the rounds: CPU per stream and per upstream chunk (medians of
    the rounds), streams and errors summed."""
    per_stream = [spent / found.streams * 1e6 for found, spent in samples if found.streams]
    median = statistics.median(per_stream) if per_stream else None
    return {
        "rounds": len(samples),
        "seconds": seconds,
        "concurrency": RELAY_CONCURRENCY,
        "streams": sum(found.streams for found, _ in samples),
        "errors": sum(found.errors for found, _ in samples),
        "events_per_stream": statistics.median(found.chunks_per_stream for found, _ in samples),
        "upstream_chunks_per_stream": STREAM_CHUNKS,
        "cpu_us_per_stream": median,
        "cpu_us_per_chunk": None if median is None else median / STREAM_CHUNKS,
        "cpu_us_per_chunk_by_round": [round(value / STREAM_CHUNKS, 2) for value in per_stream],
    }


def describe(contender: Contender, sample: Sample) -> str:
    """One sample as a progress line."""
    result = sample.result
    asked = f" (asked {result.rate:,.0f})" if result.rate else ""
    errors = f", {result.errors} ERRORS" if result.errors else ""
    workers = (
        f", connections by worker {sample.connections_by_worker}" if sample.connections_by_worker else ""
    )
    return (
        f"{report.CONTENDERS[contender.key]}, c={result.connections}: {result.rps:,.0f} req/s{asked}, "
        f"p50 {result.p50_ms:.2f} ms, p99 {result.p99_ms:.2f} ms, cpu {sample.busy:.0%}, "
        f"{sample.cpu_us_per_request:.0f} µs/req{errors}{workers}"
    )


def relay_figures(rounds: list[tuple[load.RelayResult, float, float]]) -> dict[str, Any]:
    """The relay point's rounds (each what it found, chatgate's CPU seconds and the wall's):
    their streams, chunks and errors together, and chunks per core-second as their median."""
    streams = sum(found.streams for found, _, _ in rounds)
    chunks = sum(found.chunks for found, _, _ in rounds)
    seconds = sum(found.seconds for found, _, _ in rounds)
    per_core = [found.chunks / spent for found, spent, _ in rounds if spent > 0]
    return {
        "concurrency": rounds[0][0].concurrency,
        "seconds": seconds,
        "streams": streams,
        "chunks": chunks,
        "chunks_per_s": chunks / seconds if seconds else 0.0,
        "chunks_per_stream": chunks / streams if streams else 0.0,
        "errors": sum(found.errors for found, _, _ in rounds),
        "client_cpu": statistics.mean(found.client_cpu for found, _, _ in rounds),
        "server_cpu": sum(spent for _, spent, _ in rounds) / sum(wall for _, _, wall in rounds),
        "chunks_per_core_s": statistics.median(per_core) if per_core else None,
        "rounds_chunks_per_core_s": per_core,
    }


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
    speed.add_argument(
        "--show", type=Path, metavar="JSON", help="measure nothing: print a saved run (its latest.json) "
        "against today's goals"
    )  # fmt: skip
    parser.add_argument(
        "--with-litellm", action="store_true", help=f"add LiteLLM {litellm_proxy.VERSION}'s proxy as a peer "
        f"to --quick or --smoke (the full run has it; its venv is made in {litellm_proxy.VENV} on first "
        "use: minutes)"
    )  # fmt: skip
    parser.add_argument(
        "--with-portkey", action="store_true", help=f"add Portkey's gateway {portkey_gateway.VERSION} as a "
        f"peer to --quick or --smoke (the full run has it; installed by npm into {portkey_gateway.FOLDER} "
        "on first use: seconds)"
    )  # fmt: skip
    parser.add_argument(
        "--no-peers", action="store_true", help="leave Portkey and LiteLLM out of the full run"
    )
    parser.add_argument("--seconds", type=float, help="seconds per wrk point and round (overrides the mode)")
    parser.add_argument("--memory-requests", type=int, help="requests between the RSS readings")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results", help="where latest.* go")
    parser.add_argument("--no-chart", action="store_true", help="skip the PNG (no matplotlib needed)")
    parser.add_argument(
        "--strict", action="store_true", help="exit 1 when a goal FAILs or its measurement is an ERROR"
    )
    parser.add_argument(
        "--only-concurrency", action="store_true", help="only the concurrency point (no nginx, wrk)"
    )
    parser.add_argument(
        "--only-fleet",
        action="store_true",
        help="only the fleet point (llama-server replicas; no nginx, wrk)",
    )
    parser.add_argument(
        "--with-fleet", action="store_true", help="add the fleet point to --quick or --smoke (minutes)"
    )
    parser.add_argument(
        "--concurrent-streams", type=lambda text: tuple(int(n) for n in text.split(",")),
        metavar="N,N,...", help="the concurrency point's stream counts (overrides the mode)",
    )  # fmt: skip
    parser.add_argument(
        "--concurrency-settings", type=orjson.loads, metavar="JSON",
        help="the concurrency point's deployment settings (default: "
        f"{orjson.dumps(CONCURRENCY_SETTINGS).decode()}), e.g. '{{}}' for chatgate's defaults",
    )  # fmt: skip
    parser.add_argument(
        "--chatgate-root", type=Path, default=ROOT, metavar="DIR",
        help="the concurrency point runs the chatgate of this checkout (an older one, to compare)",
    )  # fmt: skip
    return parser.parse_args(argv)


def peers_of(profile: Profile, args: argparse.Namespace) -> tuple[str, ...]:
    """The peers this run starts: the mode's own unless --no-peers, and those asked for."""
    asked = {"portkey": args.with_portkey, "litellm": args.with_litellm}
    return tuple(key for key in PEERS if asked[key] or (key in profile.peers and not args.no_peers))


def exit_code(ratios: list[dict[str, Any]], strict: bool) -> int:
    """1 under --strict when a goal FAILs or its measurement is invalid (ERROR); a goal not
    measured in this run (n/a) fails nothing."""
    failed = any(row["verdict"] in ("FAIL", "ERROR") for row in ratios)
    return 1 if strict and failed else 0


def show(path: Path, strict: bool) -> int:
    results = orjson.loads(path.read_bytes())
    results["ratios"] = report.evaluate(results)
    print(report.render(results))
    return exit_code(results["ratios"], strict)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.show:
        return show(args.show, args.strict)
    profile = PROFILES["smoke" if args.smoke else "quick" if args.quick else "full"]
    if args.seconds:
        profile = replace(profile, seconds=args.seconds)
    if args.memory_requests is not None:
        profile = replace(profile, memory_requests=args.memory_requests)
    if args.concurrent_streams:
        profile = replace(profile, concurrent_streams=args.concurrent_streams)
    if args.with_fleet:
        profile = replace(profile, fleet=True)
    only = args.only_concurrency or args.only_fleet
    missing = [] if only else missing_requirements(chart=not args.no_chart)
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
        bench = Bench(
            profile, Path(tmp), cores, stack, peers_of(profile, args),
            args.chatgate_root.resolve(), args.concurrency_settings,
        )  # fmt: skip
        results = bench.run(args.only_concurrency, args.only_fleet)
        elapsed = time.monotonic() - bench.started
    results = {
        "meta": {
            "mode": profile.mode,
            "started": started.strftime("%Y-%m-%d %H:%M UTC"),
            "elapsed_s": round(elapsed, 1),
            "seconds_per_point": profile.seconds,
            "capped_seconds_per_point": profile.capped_seconds,
            "rounds": profile.rounds,
            "memory_requests": profile.memory_requests,
            "with_litellm": "litellm" in bench.peers,
            "peers": list(bench.peers),
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
    print("\n".join(fleet.render(results)) if args.only_fleet else report.render(results))
    report.write_json(results, args.out / "latest.json")
    written = [str(args.out / "latest.json")]
    if not args.no_chart and not only:  # the chart draws the other points
        report.draw_chart(results, args.out / "latest.png")
        written.append(str(args.out / "latest.png"))
    print("written: " + ", ".join(written))
    return exit_code(results["ratios"], args.strict)
