"""How far past a budget its key gets (issue 28): `python -m bench.budgets`.

Two `chatgate serve` processes share one real redis-server, in front of an upstream at an LLM's
pace (bench/slow_upstream.py: every answer a 64-chunk stream, one chunk every `--gap-ms`, whose
usage is always 24 prompt and 61 completion tokens). N clients (8, 32, 64 in flight) stream
requests with `max_tokens` 61, alternating between the gateways, each until the budget refuses
it; the table says how many tokens were served (the answers' usage) against the budget, for a
soft budget (admission reserves the prompt) and a hard one (the prompt and max_tokens).

The soft bound: a request is admitted only while what is spent and held, plus its prompt, fits
the budget; what the requests then in flight add past their prompts is at most their completions.
So with at most `in_flight` requests at once, each generating at most `n × max_tokens`, a soft
budget ends at most `in_flight × n × max_tokens` tokens past its amount (when the prompt count at
admission is not below the upstream's; a tokenizer makes it exact). A hard budget ends at or
below its amount.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import redis
import yaml

from bench.processes import Server, accepts_connections, answers_health, free_port, start_server
from bench.upstream import USAGE, WORDS
from gateway.core.token_count import estimate
from gateway.policy.auth import new_key

ROOT = Path(__file__).resolve().parent.parent
IN_FLIGHT = (8, 32, 64)
BUDGET = 3000
GAP_MS = 5  # between two chunks of a stream: an answer takes about 64 × 5 ms
MAX_TOKENS = len(WORDS)  # what the upstream generates, every time: the most there is
QUESTION = "Tell me, in a few words that I can read at a glance, what the city of Lisbon is like."
MESSAGES = [{"role": "user", "content": QUESTION}]
# admission's estimate of the prompt must not be below the upstream's count for the bounds to hold
assert estimate(MESSAGES) >= USAGE["prompt_tokens"]
MODES = ("soft", "hard")


@dataclass(frozen=True, slots=True)
class Run:
    mode: str
    in_flight: int
    budget: int
    served: int  # the usage of every answer given
    spent: float  # what the store says the key spent
    admitted: int
    refused: int
    per_request: int  # one answer's tokens

    @property
    def over(self) -> int:
        return self.served - self.budget

    @property
    def bound(self) -> int:
        """The most a budget may be passed by: nothing when hard, the in-flight completions when soft."""
        return 0 if self.mode == "hard" else self.in_flight * MAX_TOKENS


def key_name(mode: str, in_flight: int) -> str:
    return f"{mode}-{in_flight}"


@contextmanager
def running_redis(workdir: Path) -> Iterator[str]:
    """A redis-server on a loopback port, without persistence: its URL."""
    server = shutil.which("redis-server")
    if server is None:
        raise SystemExit("redis-server is required (apt-get install redis-server)")
    port = free_port()
    process = subprocess.Popen(
        [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(workdir)],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + 10
    try:
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield url
    finally:
        client.close()
        process.kill()
        process.wait(timeout=10)


def config(redis_url: str, upstream: str, keys: dict[str, str], budget: int) -> dict:
    """One key per run (its own budget account), named `<mode>-<in flight>`."""
    return {
        "keys": [
            {"name": name, "sha256": sha,
             "budgets": [{"tokens": budget, "per": "day", "hard": name.startswith("hard")}]}
            for name, sha in keys.items()
        ],
        "deployments": [
            {"name": "paced", "backend": "openai-compatible", "options": {"base_url": f"{upstream}/v1"}}
        ],
        "rate_limits": {"store": "redis", "redis": {"url": redis_url}},
    }  # fmt: skip


@contextmanager
def paced_upstream(workdir: Path, gap_ms: int) -> Iterator[str]:
    port = free_port()
    command = [sys.executable, "-m", "bench.slow_upstream", str(port), str(gap_ms)]
    log = workdir / "upstream.log"
    server = start_server("upstream", command, port, log, accepts_connections(port), ROOT)
    try:
        yield server.url
    finally:
        server.stop()


@contextmanager
def two_gateways(workdir: Path, settings: dict) -> Iterator[list[str]]:
    """Two `chatgate serve` processes on the same config: their base URLs."""
    path = workdir / "budgets.yaml"
    path.write_text(yaml.safe_dump(settings))
    servers: list[Server] = []
    try:
        for index in range(2):
            port = free_port()
            command = [sys.executable, "-m", "gateway", "serve", "--port", str(port), "--config", str(path)]
            log = workdir / f"gateway-{index}.log"
            servers.append(start_server(f"gateway-{index}", command, port, log, answers_health(port), ROOT))
        yield [server.url for server in servers]
    finally:
        for server in servers:
            server.stop()


def spent_in_store(redis_url: str, key: str) -> float:
    client = redis.Redis.from_url(redis_url)
    try:
        names = list(client.scan_iter(match=f"*budget:{key}:tokens:*:account"))
        return sum(float(client.hget(name, "spent") or 0) for name in names)
    finally:
        client.close()


async def streamed_usage(client: httpx.AsyncClient, url: str, headers: dict[str, str]) -> int | str:
    """One streamed answer's total tokens (from its usage chunk), or the refusal's text."""
    body = {
        "model": "paced", "messages": MESSAGES, "max_tokens": MAX_TOKENS, "stream": True,
        "stream_options": {"include_usage": True},
    }  # fmt: skip
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body, headers=headers) as answer:
        if answer.status_code == 429:
            return (await answer.aread()).decode()
        if answer.status_code != 200:
            raise RuntimeError(f"{answer.status_code}: {(await answer.aread()).decode()}")
        total = None
        async for line in answer.aiter_lines():
            if line.startswith("data: {") and '"usage":{' in line:
                total = json.loads(line[6:])["usage"]["total_tokens"]
        if total is None:
            raise RuntimeError("a stream ended without its usage")
        return int(total)


async def until_refused(gateways: list[str], secret: str, in_flight: int) -> tuple[list[int], int]:
    """`in_flight` clients, each sending one request after another (alternating gateways) until
    the budget refuses it: every admitted answer's tokens, and how many were refused."""
    headers = {"authorization": f"Bearer {secret}"}
    served: list[int] = []
    refused = 0
    limits = httpx.Limits(max_connections=in_flight, max_keepalive_connections=in_flight)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:

        async def one_client(index: int) -> None:
            nonlocal refused
            sent = index
            while True:
                answer = await streamed_usage(client, gateways[sent % 2], headers)
                sent += 1
                if isinstance(answer, str):
                    if "budget" not in answer:
                        raise RuntimeError(f"refused, but not by the budget: {answer}")
                    refused += 1
                    return
                served.append(answer)

        await asyncio.gather(*(one_client(index) for index in range(in_flight)))
    return served, refused


def measure(
    modes: tuple[str, ...] = MODES,
    in_flight: tuple[int, ...] = IN_FLIGHT,
    budget: int = BUDGET,
    gap_ms: int = GAP_MS,
) -> list[Run]:
    """Every (mode, in flight) run, on two gateways, one Redis and one upstream started for them."""
    keys = {key_name(mode, count): new_key() for mode in modes for count in in_flight}
    with ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="chatgate-budgets-")))
        redis_url = stack.enter_context(running_redis(workdir))
        upstream = stack.enter_context(paced_upstream(workdir, gap_ms))
        settings = config(redis_url, upstream, {name: sha for name, (_secret, sha) in keys.items()}, budget)
        gateways = stack.enter_context(two_gateways(workdir, settings))
        runs = []
        for mode in modes:
            for count in in_flight:
                name = key_name(mode, count)
                served, refused = asyncio.run(until_refused(gateways, keys[name][0], count))
                runs.append(
                    Run(mode, count, budget, sum(served), spent_in_store(redis_url, name), len(served),
                        refused, served[0] if served else 0)
                )  # fmt: skip
        return runs


def table(runs: list[Run]) -> str:
    lines = [
        f"budget {runs[0].budget:,} tokens a day; each answer {runs[0].per_request} tokens "
        f"(prompt estimated {estimate(MESSAGES)}, max_tokens {MAX_TOKENS}); two gateways, one Redis",
        "",
        "| budget | in flight | served | in Redis | over | over % | bound | answers | refused |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        lines.append(
            f"| {run.mode} | {run.in_flight} | {run.served:,} | {run.spent:,.0f} | {run.over:+,} | "
            f"{100 * run.over / run.budget:+.1f} % | {run.bound:,} | {run.admitted} | {run.refused} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.budgets", description=__doc__.split("\n\n")[0])
    parser.add_argument("--in-flight", type=int, nargs="+", default=list(IN_FLIGHT))
    parser.add_argument("--budget", type=int, default=BUDGET)
    parser.add_argument("--gap-ms", type=int, default=GAP_MS, help="between two chunks of an answer")
    options = parser.parse_args(argv)
    runs = measure(MODES, tuple(options.in_flight), options.budget, options.gap_ms)
    print(table(runs))
    broken = [run for run in runs if run.over > run.bound]
    for run in broken:
        print(f"{run.mode} at {run.in_flight} in flight passed its bound: {run.over} > {run.bound}")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
