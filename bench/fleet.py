"""The fleet point: chatgate in front of two llama.cpp server replicas, routing one workload four
ways: round-robin, today's power of two choices on the gateway's own count, the same on what
the servers' /metrics say (load-aware), and load-aware with prefix affinity.

The replicas: llama.cpp's own `llama-server` (one thread each, `-np 2` slots, `-c 4096`,
`--metrics`), each on a CPU of its own where there are two, on a 25.7M-parameter model (big
enough for prompt processing to matter: a 1,800-token prompt takes seconds on a CPU thread,
tens of milliseconds when the server's prompt cache holds it). Each server keeps only a few
prompts (its slots and `--cache-ram` of CACHE_RAM_MIB, about seven at 8 KiB a token): fewer
than the tenants and their conversations, as a GPU's KV cache holds fewer prefixes than a busy
fleet sends it, while the two replicas together hold every tenant's prompt (the case prefix
affinity is for). Both replicas are started afresh for each routing (an empty cache each time).

The workload: tenants with long system prompts of their own (~1,450 tokens), several
conversations each, each conversation a few turns (the turn before and its answer part of the
next one's prompt); the conversations arrive one every `arrival_gap` seconds, in an order that
mixes the tenants, and run concurrently. Before it, unmeasured, one request of each tenant's
(a few at once) stands for the traffic a fleet serving these tenants has had: the point is the
steady state, not a fleet's first minute. Each request streams; its time to the first token is
the time to the first chunk with text, as its client sees it; output tokens/s is every answer's
completion tokens (the usage chunk) over the workload's wall time. The routings take turns for
`rounds` rounds, and each one's turns are pooled: where P2C lands a handful of turns moves one
round's p90 severalfold.

Needs a llama-server binary and the model's GGUF: `CHATGATE_LLAMA_SERVER` and
`CHATGATE_FLEET_GGUF`, else the suite's own (tests/support/real_servers.py, when it has them).
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from bench.load import percentile
from bench.processes import Server, answers_health, free_port, pinned, start_server

ROUTINGS: dict[str, dict[str, Any]] = {
    "round-robin": {"pick": "round-robin"},
    "p2c": {},  # today's default: the gateway's own count
    "load-aware": {"load_from": "metrics", "scrape_interval": 0.25},
    # prefill dominates here (a cold prompt costs seconds, a queued turn behind a cached one
    # tens of milliseconds): a looser bound than the default 1.25 keeps more turns on their cache
    "load-aware + affinity": {
        "load_from": "metrics",
        "scrape_interval": 0.25,
        "affinity": {"enabled": True, "bound": 2.0},
    },
}
LABELS = {
    "round-robin": "round-robin",
    "p2c": "P2C, gateway's count (today)",
    "load-aware": "P2C on the servers' /metrics",
    "load-aware + affinity": "/metrics + prefix affinity",
}
MODEL = "fleet"
SLOTS = 2  # -np: requests a replica runs at once
CONTEXT = 4096  # -c, shared by the slots
CACHE_RAM_MIB = 64  # the host-memory prompt cache: about five long prompts beside the slots'
# words the model's tokenizer knows (tests/support/tiny_model.py): about 2.1 tokens a word
VOCABULARY = (
    "the quick brown fox jumps over lazy dog while cat sleeps in warm sun gateway "
    "receives chat requests routes them to model and streams answer back river flows "
    "past green hills small houses tall trees quiet fields stone bridge"
)
WORDS = tuple(VOCABULARY.split())
START_TIMEOUT = 30.0


@dataclass(frozen=True)
class Workload:
    tenants: int = 8
    conversations_per_tenant: int = 2
    turns: int = 3
    system_words: int = 680  # about 1,450 tokens with the model's tokenizer
    question_words: int = 12
    max_tokens: int = 16
    arrival_gap: float = 2.5  # seconds between two conversations' first turns
    think: float = 0.5  # seconds between an answer and the conversation's next turn
    seed: int = 41
    warm_up_at_once: int = 4  # the unmeasured first requests, one a tenant, this many at a time
    rounds: int = 3  # each routing's workload this many times, afresh, its turns pooled


QUICK = Workload(tenants=4, conversations_per_tenant=2, turns=2, rounds=1)


@dataclass
class Turn:
    ttft_ms: float
    tokens: int
    error: str = ""


@dataclass
class RoutingResult:
    routing: str
    rounds: int = 0
    requests: int = 0
    errors: int = 0
    seconds: float = 0.0
    ttft_p50_ms: float = 0.0
    ttft_p90_ms: float = 0.0
    ttft_p90_ms_by_round: list[float] = field(default_factory=list)
    output_tokens: int = 0
    output_tokens_per_s: float = 0.0
    affinity: dict[str, float] = field(default_factory=dict)
    cached_share: float = 0.0  # prompt tokens the servers took from their caches
    error_kinds: dict[str, int] = field(default_factory=dict)


def locate() -> tuple[Path, Path]:
    """The llama-server binary and the model's GGUF; RuntimeError saying what is missing."""
    binary = os.environ.get("CHATGATE_LLAMA_SERVER") or shutil.which("llama-server")
    gguf = os.environ.get("CHATGATE_FLEET_GGUF")
    if binary is None or gguf is None:
        found = suite_servers()
        binary = binary or (str(found[0]) if found else None)
        gguf = gguf or (str(found[1]) if found else None)
    if binary is None or gguf is None or not Path(binary).is_file() or not Path(gguf).is_file():
        raise RuntimeError(
            "the fleet point needs llama.cpp's llama-server and the 25.7M-parameter model's GGUF: "
            "set CHATGATE_LLAMA_SERVER and CHATGATE_FLEET_GGUF (or install the suite's real servers: "
            "python -m tests.support.real_servers)"
        )
    return Path(binary), Path(gguf)


def suite_servers() -> tuple[Path, Path] | None:
    """The suite's llama-server and medium model, where tests/support/real_servers.py has them."""
    try:
        from tests.support import real_servers
    except ImportError:
        return None
    try:
        binary = real_servers.llama_server_binary()
        return binary, real_servers.cached_gguf("medium")
    except (AssertionError, OSError, RuntimeError):
        return None


def system_prompt(tenant: int, words: int) -> str:
    rng = random.Random(tenant * 7919 + 1)
    return f"Tenant {tenant}. " + " ".join(rng.choice(WORDS) for _ in range(words))


def question(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)) + "?"


class Replicas:
    """Two llama-servers, started afresh (empty caches) for each routing."""

    def __init__(self, binary: Path, gguf: Path, tmp: Path, cores: list[str | None]) -> None:
        self.binary, self.gguf, self.tmp, self.cores = binary, gguf, tmp, cores
        self.servers: list[Server] = []

    def start(self) -> list[Server]:
        self.stop()
        for index, cores in enumerate(self.cores):
            port = free_port()
            command = [
                str(self.binary), "-m", str(self.gguf), "--host", "127.0.0.1", "--port", str(port),
                "--metrics", "-a", MODEL, "-t", "1", "-tb", "1", "--no-webui", "-c", str(CONTEXT),
                "-np", str(SLOTS), "--cache-ram", str(CACHE_RAM_MIB),
            ]  # fmt: skip
            log = self.tmp / f"llama-server-{index}-{port}.log"
            environment = {**os.environ, "LD_LIBRARY_PATH": str(self.binary.parent)}
            self.servers.append(
                start_server(
                    f"llama-server {index}", pinned(cores, command), port, log, answers_health(port),
                    cwd=self.tmp, env=environment, timeout=START_TIMEOUT,
                )
            )  # fmt: skip
        return self.servers

    def stop(self) -> None:
        for server in self.servers:
            server.stop()
        self.servers = []

    def prompt_tokens(self) -> tuple[float, float]:
        """Prompt tokens taken from the servers' caches, and those computed, both replicas."""
        cached = computed = 0.0
        for server in self.servers:
            text = fetch_text(server.url + "/metrics")
            cached += metric_value(text, "llamacpp:prompt_tokens_cached_total")
            computed += metric_value(text, "llamacpp:prompt_tokens_total")
        return cached, computed


def fetch_text(url: str) -> str:
    async def get() -> str:
        async with aiohttp.ClientSession() as session, session.get(url) as answer:
            return await answer.text()

    try:
        return asyncio.run(get())
    except (aiohttp.ClientError, OSError):
        return ""


def metric_value(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total += float(line.rpartition(" ")[2])
    return total


async def one_turn(
    session: aiohttp.ClientSession, url: str, messages: list[dict[str, str]], max_tokens: int
) -> tuple[Turn, str]:
    body = {
        "model": MODEL, "messages": messages, "stream": True, "max_tokens": max_tokens,
        "stream_options": {"include_usage": True}, "temperature": 0,
    }  # fmt: skip
    began = time.perf_counter()
    ttft = None
    text: list[str] = []
    tokens = 0
    try:
        async with session.post(url, json=body) as answer:
            if answer.status != 200:
                return Turn(0.0, 0, f"HTTP {answer.status}"), ""
            async for raw in answer.content:
                line = raw.strip()
                if not line.startswith(b"data:") or line == b"data: [DONE]":
                    continue
                chunk = orjson.loads(line[5:])
                for choice in chunk.get("choices") or ():
                    piece = (choice.get("delta") or {}).get("content")
                    if piece:
                        if ttft is None:
                            ttft = (time.perf_counter() - began) * 1000
                        text.append(piece)
                if chunk.get("usage"):
                    tokens = chunk["usage"].get("completion_tokens", 0)
    except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError) as error:
        return Turn(0.0, 0, type(error).__name__), ""
    if ttft is None:
        return Turn(0.0, tokens, "no text"), ""
    return Turn(ttft, tokens), "".join(text)


async def conversation(
    session: aiohttp.ClientSession, url: str, tenant: int, number: int, workload: Workload, turns: list[Turn]
) -> None:
    rng = random.Random(workload.seed * 1000 + tenant * 10 + number)
    messages = [{"role": "system", "content": system_prompt(tenant, workload.system_words)}]
    for _ in range(workload.turns):
        messages.append({"role": "user", "content": question(rng, workload.question_words)})
        turn, answer = await one_turn(session, url, messages, workload.max_tokens)
        turns.append(turn)
        if turn.error:
            return
        messages.append({"role": "assistant", "content": answer})
        await asyncio.sleep(workload.think)


async def warm_up(url: str, workload: Workload) -> list[Turn]:
    """One request of each tenant's, unmeasured: the fleet has served these tenants before."""
    limit = asyncio.Semaphore(workload.warm_up_at_once)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:

        async def one(tenant: int) -> Turn:
            async with limit:
                messages = [
                    {"role": "system", "content": system_prompt(tenant, workload.system_words)},
                    {"role": "user", "content": "hello?"},
                ]
                turn, _ = await one_turn(session, url, messages, 2)
                return turn

        return await asyncio.gather(*(one(tenant) for tenant in range(workload.tenants)))


async def run_workload(url: str, workload: Workload) -> tuple[list[Turn], float]:
    order = [(t, c) for c in range(workload.conversations_per_tenant) for t in range(workload.tenants)]
    random.Random(workload.seed).shuffle(order)
    turns: list[Turn] = []
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:

        async def arriving(index: int, tenant: int, number: int) -> None:
            await asyncio.sleep(index * workload.arrival_gap)
            await conversation(session, url, tenant, number, workload, turns)

        began = time.perf_counter()
        await asyncio.gather(*(arriving(i, t, c) for i, (t, c) in enumerate(order)))
        return turns, time.perf_counter() - began


def chatgate_config(replicas: list[Server], routing: dict[str, Any]) -> dict[str, Any]:
    return {
        "deployments": [
            {
                "name": MODEL,
                "backend": "openai-compatible",
                "replicas": [
                    {"name": f"r{i}", "options": {"base_url": f"{server.url}/v1"}}
                    for i, server in enumerate(replicas)
                ],
                "routing": routing,
                "timeouts": {"first_token": 300, "total": 600},
                "health": {"failures": 1000},
            }
        ]
    }


def affinity_counts(url: str) -> dict[str, float]:
    text = fetch_text(url + "/metrics")
    return {
        outcome: metric_value(
            text, f'chatgate_route_affinity_total{{deployment="{MODEL}",outcome="{outcome}"}}'
        )
        for outcome in ("hit", "miss", "overridden")
    }


@dataclass
class RoundSample:
    """One round of one routing: its turns as measured, and what the servers and gateway said."""

    turns: list[Turn]
    seconds: float
    cached: float
    computed: float
    affinity: dict[str, float]


def measure(
    routing: str,
    replicas: Replicas,
    start_chatgate: Callable[[str, dict[str, Any]], Server],
    workload: Workload,
) -> RoundSample:
    """One round: both replicas and the gateway started afresh, the warm-up, then the workload."""
    servers = replicas.start()
    gateway = start_chatgate(f"chatgate fleet {routing}", chatgate_config(servers, ROUTINGS[routing]))
    try:
        url = gateway.url + "/v1/chat/completions"
        # (a first token that is part of a character comes as no text: that is no failure here)
        failed = [t.error for t in asyncio.run(warm_up(url, workload)) if t.error not in ("", "no text")]
        if failed:
            raise RuntimeError(f"the warm-up failed: {failed}; {servers[0].log_tail(5)}")
        cached_before, computed_before = replicas.prompt_tokens()
        turns, seconds = asyncio.run(run_workload(url, workload))
        cached, computed = replicas.prompt_tokens()
        affinity = affinity_counts(gateway.url) if "affinity" in routing else {}
        return RoundSample(turns, seconds, cached - cached_before, computed - computed_before, affinity)
    finally:
        gateway.stop()
        replicas.stop()


def summarize(routing: str, samples: list[RoundSample]) -> RoutingResult:
    """The rounds of one routing pooled: percentiles over every turn of every round, tokens/s
    over the rounds' summed wall time (where P2C happens to land a handful of turns moves one
    round's p90 severalfold; the pooled rounds move far less)."""
    turns = [t for s in samples for t in s.turns]
    good = [t for t in turns if not t.error]
    ttfts = [t.ttft_ms for t in good]
    tokens = sum(t.tokens for t in good)
    seconds = sum(s.seconds for s in samples)
    cached, computed = sum(s.cached for s in samples), sum(s.computed for s in samples)
    kinds: dict[str, int] = {}
    for t in turns:
        if t.error:
            kinds[t.error] = kinds.get(t.error, 0) + 1
    affinity: dict[str, float] = {}
    for s in samples:
        for outcome, count in s.affinity.items():
            if count:
                affinity[outcome] = affinity.get(outcome, 0) + count
    return RoutingResult(
        routing=routing,
        rounds=len(samples),
        requests=len(turns),
        errors=len(turns) - len(good),
        seconds=round(seconds, 2),
        ttft_p50_ms=round(percentile(ttfts, 0.5), 1) if ttfts else 0.0,
        ttft_p90_ms=round(percentile(ttfts, 0.9), 1) if ttfts else 0.0,
        ttft_p90_ms_by_round=[p90_of(s.turns) for s in samples],
        output_tokens=tokens,
        output_tokens_per_s=round(tokens / seconds, 2) if seconds else 0.0,
        affinity=affinity,
        cached_share=round(cached / (cached + computed), 3) if cached + computed else 0.0,
        error_kinds=kinds,
    )


def p90_of(turns: list[Turn]) -> float:
    times = [t.ttft_ms for t in turns if not t.error]
    return round(percentile(times, 0.9), 1) if times else 0.0


def fleet_point(
    tmp: Path,
    start_chatgate: Callable[[str, dict[str, Any]], Server],
    say: Callable[[str], None],
    workload: Workload = Workload(),
    cores: list[str | None] | None = None,
) -> dict[str, Any]:
    """Every routing over the same workload, `workload.rounds` times, the routings taking turns
    round by round (so a busy minute on the machine falls on all of them alike):
    {"workload": …, "routings": {name: figures of the rounds pooled}}."""
    binary, gguf = locate()
    cpus = sorted(os.sched_getaffinity(0))
    cores = cores or ([str(cpus[0]), str(cpus[1])] if len(cpus) >= 2 else [None, None])
    replicas = Replicas(binary, gguf, tmp, cores)
    results: dict[str, Any] = {"workload": asdict(workload), "model": gguf.name, "routings": {}}
    samples: dict[str, list[RoundSample]] = {routing: [] for routing in ROUTINGS}
    failed: dict[str, str] = {}
    for number in range(1, workload.rounds + 1):
        for routing in ROUTINGS:
            if routing in failed:
                continue
            try:
                sample = measure(routing, replicas, start_chatgate, workload)
            except Exception as error:  # one routing's failure leaves the others' figures
                failed[routing] = f"{type(error).__name__}: {error}"
                say(f"fleet, {routing}: {error}")
                continue
            samples[routing].append(sample)
            found = summarize(routing, [sample])
            say(
                f"fleet, round {number}/{workload.rounds}, {LABELS[routing]}: "
                f"TTFT p50 {found.ttft_p50_ms:,.0f} ms, p90 {found.ttft_p90_ms:,.0f} ms, "
                f"{found.output_tokens_per_s:.1f} output tokens/s, {found.errors} errors "
                f"{found.error_kinds or ''}, {found.cached_share:.0%} of prompt tokens cached"
            )
    for routing in ROUTINGS:
        results["routings"][routing] = (
            {"error": failed[routing]} if routing in failed else asdict(summarize(routing, samples[routing]))
        )
    return results


def render(results: dict[str, Any]) -> list[str]:
    """The fleet point's table, with affinity's gain over today's P2C."""
    fleet = results.get("fleet")
    if not fleet:
        return []
    if fleet.get("error"):
        return ["", f"fleet: error: {fleet['error']}"]
    w = fleet["workload"]
    requests = w["tenants"] * w["conversations_per_tenant"] * w["turns"]
    rounds = w.get("rounds", 1)
    lines = [
        "",
        f"fleet: 2 llama-server replicas ({SLOTS} slots, 1 thread each, {fleet['model']}); "
        f"{w['tenants']} tenants × {w['conversations_per_tenant']} conversations × {w['turns']} turns "
        f"= {requests} streamed requests a round, {rounds} round{'' if rounds == 1 else 's'} pooled, "
        f"~{w['system_words']}-word system prompts",
        f"{'routing':<34}{'TTFT p50 ms':>12}{'TTFT p90 ms':>12}{'out tok/s':>10}{'cached':>8}{'errors':>7}"
        "   p90 by round",
    ]
    for name, entry in fleet["routings"].items():
        if entry.get("error"):
            lines.append(f"{LABELS.get(name, name):<34}error: {entry['error'].splitlines()[0][:90]}")
            continue
        lines.append(
            f"{LABELS.get(name, name):<34}{entry['ttft_p50_ms']:>12,.0f}{entry['ttft_p90_ms']:>12,.0f}"
            f"{entry['output_tokens_per_s']:>10.1f}{entry['cached_share']:>8.0%}{entry['errors']:>7}"
            f"   {' / '.join(f'{p90:,.0f}' for p90 in entry.get('ttft_p90_ms_by_round', ()))}"
        )
    base, best = fleet["routings"].get("p2c", {}), fleet["routings"].get("load-aware + affinity", {})
    if base.get("ttft_p90_ms") and best.get("ttft_p90_ms"):
        gain = base["ttft_p90_ms"] / best["ttft_p90_ms"]
        kept = best["output_tokens_per_s"] / base["output_tokens_per_s"] if base["output_tokens_per_s"] else 0
        lines.append(
            f"affinity vs today's P2C: TTFT p90 {gain:.1f}× lower (goal ≥ 3×), output tokens/s {kept:.2f}× "
            f"(goal ≥ 1×); affinity picks {best.get('affinity', {})}"
        )
    return lines
