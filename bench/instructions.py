"""`python -m bench.instructions`: the machine instructions a chatgate request costs, counted.

CPU time per request moved by a fifth within minutes on the project's shared 2-core machines,
more than most single cuts are worth (docs/benchmarks/2026-11-28-relay.md). An instruction count
does not depend on what else the machine is doing: one worker runs under valgrind's callgrind
(about 50× slower, so the gateway starts in a minute or two), answers some requests to warm up,
then each round zeroes the counters, answers `--requests` requests one after another from this
process, and dumps the count. A round's count over its requests is the figure; rounds of the
same code agree within a few tenths of a percent, so before and after a change compare on any
machine. It counts the gateway's own user-space instructions (threads included), not the
kernel's work in its system calls nor time spent waiting; where the time goes by part is
`python -m bench.profile`.

Needs valgrind (callgrind_control comes with it), and nginx for `--upstream`.

    python -m bench.instructions [--upstream] [--policy] [--stream] [--dialect chat|messages|responses]
                                 [--turns N] [--floor] [--paced MS]
                                 [--requests 200] [--rounds 3] [--warmup 50]

`--paced 20` streams from bench/slow_upstream.py instead of nginx, a chunk every 20 ms: each chunk
is then a read, a wakeup and a write of its own, as at a model's pace, where nginx's 64 chunks
arrive together and are relayed in a few reads. Each request then takes 64 gaps: ask for a few
(`--requests 6 --warmup 2`). With `--floor` the floor relays the same paced stream: what a chunk
costs a Python pass-through at that pace.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx
import orjson
import yaml

from bench.dialects import DIALECTS
from bench.processes import Server, accepts_connections, answers_health, free_port, start_server
from bench.profile import KEY, add_request_options, config, described
from bench.run import ROOT, STREAM_PATH
from bench.upstream import STREAM_CHUNKS, nginx_command, write_nginx_files

TURN_WORDS = "some words of an earlier turn of the conversation, " * 10
START_TIMEOUT = 900.0  # the gateway's imports under callgrind: about a minute on a quiet machine


def summary(dump: Path) -> int:
    """The instructions a callgrind dump counted (its `summary:` line: every thread's, all
    functions)."""
    for line in dump.read_text(errors="replace").splitlines():
        if line.startswith("summary:"):
            return int(line.split()[1])
    raise ValueError(f"{dump}: no summary line (not a callgrind dump?)")


def control(pid: int, *arguments: str) -> None:
    """A callgrind_control command to the worker (zero the counters, dump them)."""
    subprocess.run(["callgrind_control", *arguments, str(pid)], check=True, capture_output=True, timeout=120)


def dumps(tmp: Path, pid: int) -> list[Path]:
    """The worker's dumps so far, in order (callgrind numbers them `.1`, `.2`, …)."""
    return sorted(tmp.glob(f"callgrind.out.{pid}.*"), key=lambda path: int(path.suffix[1:]))


def ask(client: httpx.Client, url: str, body: bytes, headers: dict[str, str], count: int) -> None:
    """`count` requests, one after another, each read to its end; any but a 200 stops the run."""
    for _ in range(count):
        with client.stream("POST", url, content=body, headers=headers) as response:
            response.read()
            if response.status_code != 200:
                raise RuntimeError(f"HTTP {response.status_code}: {response.text[:300]}")


def with_turns(request: dict[str, Any], turns: int) -> dict[str, Any]:
    """A chat request with `turns` earlier turns of conversation before its question, as an
    agent sends them: 200 turns make a body of about 100 KB."""
    if not turns:
        return request
    said = [
        {"role": "user" if turn % 2 == 0 else "assistant", "content": f"Turn {turn}: " + TURN_WORDS}
        for turn in range(turns)
    ]
    return {**request, "messages": [request["messages"][0], *said, *request["messages"][1:]]}


def counted(
    name: str,
    command: list[str],
    port: int,
    url: str,
    body: bytes,
    headers: dict[str, str],
    args: argparse.Namespace,
    tmp: Path,
    env: dict[str, str] | None = None,
) -> list[float]:
    """Each round's instructions per request of one server, started under callgrind."""
    command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/callgrind.out.%p", *command]
    ready = answers_health(port) if name == "chatgate" else accepts_connections(port)
    server = start_server(name, command, port, tmp / f"{name}.log", ready, ROOT, env, START_TIMEOUT)
    try:
        pid = server.process.pid
        figures = []
        with httpx.Client(timeout=120) as client:
            ask(client, server.url + url, body, headers, args.warmup)
            for _ in range(args.rounds):
                control(pid, "--zero")
                ask(client, server.url + url, body, headers, args.requests)
                control(pid, "--dump")
                figures.append(summary(dumps(tmp, pid)[-1]) / args.requests)
        return figures
    finally:
        server.stop()


def measure(args: argparse.Namespace, tmp: Path) -> dict[str, list[float]]:
    """Each round's instructions per request: chatgate's, and the floor's with `--floor`."""
    upstream_server: Server | None = None
    try:
        upstream = None
        if args.paced:
            port = free_port()
            command = [sys.executable, "-m", "bench.slow_upstream", str(port), str(args.paced)]
            upstream_server = start_server(
                "paced upstream", command, port, tmp / "paced.log", accepts_connections(port), ROOT
            )
            upstream = upstream_server.url
        elif args.upstream:
            port = free_port()
            conf = write_nginx_files(tmp, port)
            upstream_server = start_server(
                "nginx", nginx_command(tmp, conf), port, tmp / "nginx.log", accepts_connections(port), tmp
            )
            upstream = upstream_server.url
        path = tmp / "chatgate.yaml"
        path.write_text(yaml.safe_dump(config(upstream, args.policy), sort_keys=False))
        dialect = DIALECTS[args.dialect]
        body = orjson.dumps(
            with_turns(dialect.stream_request if args.stream else dialect.request, args.turns)
        )
        headers = {"Content-Type": "application/json"}
        if args.policy:
            headers["Authorization"] = f"Bearer {KEY}"
        port = free_port()
        # sys.executable itself, not a `python` on PATH that may be a shell script (pyenv's shim)
        # which callgrind would count instead of the interpreter it then runs
        command = [sys.executable, "-m", "gateway", "serve", "--config", str(path), "--port", str(port),
                   "--log-level", "warning"]  # fmt: skip
        found = {"chatgate": counted("chatgate", command, port, dialect.path, body, headers, args, tmp)}
        if args.floor and upstream is not None:
            port = free_port()
            command = [
                sys.executable, "-m", "uvicorn", "bench.floor:app", "--port", str(port),
                "--loop", "uvloop", "--http", "httptools", "--lifespan", "on", "--workers", "1",
                "--no-access-log", "--log-level", "warning",
            ]  # fmt: skip
            env = {**os.environ, "BENCH_UPSTREAM": upstream}
            # the floor keeps nginx's paths (the paced upstream streams to any POST)
            url = STREAM_PATH if args.stream else dialect.path
            found["floor"] = counted("floor", command, port, url, body, headers, args, tmp, env)
        return found
    finally:
        if upstream_server is not None:
            upstream_server.stop()


def report(args: argparse.Namespace, found: dict[str, list[float]]) -> None:
    what = described(args)
    if args.turns:
        size = len(orjson.dumps(with_turns(DIALECTS[args.dialect].request, args.turns)))
        what += f", {args.turns} earlier turns ({size:,} bytes)"
    print(f"c=1, {args.requests} requests a round, {what}")
    medians = {}
    for name, figures in found.items():
        rounds = ", ".join(f"{figure:,.0f}" for figure in figures)
        median = medians[name] = statistics.median(figures)
        spread = (max(figures) - min(figures)) / median if median else 0.0
        print(
            f"{name}: instructions per request: median {median:,.0f} (rounds: {rounds}; spread {spread:.2%})"
        )
        if args.stream:
            print(
                f"{name}: instructions per chunk: {median / STREAM_CHUNKS:,.0f} "
                f"({STREAM_CHUNKS} chunks a request)"
            )
    if "floor" in medians and medians["chatgate"]:
        print(f"the floor's instructions are {medians['floor'] / medians['chatgate']:.0%} of chatgate's")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.instructions", description=__doc__.splitlines()[0])
    add_request_options(parser, "also per chunk")
    parser.add_argument("--requests", type=int, default=200, help="requests counted a round (default: 200)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds counted (default: 3)")
    parser.add_argument("--warmup", type=int, default=50, help="requests before counting (default: 50)")
    parser.add_argument(
        "--turns",
        type=int,
        default=0,
        help="earlier turns of conversation in each request (chat; 200: ~100 KB)",
    )
    parser.add_argument(
        "--floor",
        action="store_true",
        help="also count the Python floor, bench/floor.py (with --upstream or --paced, chat)",
    )
    parser.add_argument(
        "--paced",
        type=int,
        metavar="MS",
        help="stream from bench/slow_upstream.py, a chunk every MS ms, not nginx at once (implies --stream)",
    )
    args = parser.parse_args(argv)
    if args.paced is not None:
        if args.paced < 1 or args.turns:
            parser.error("--paced is a gap of at least 1 ms, without --turns")
        args.upstream = args.stream = True
    if args.requests < 1 or args.rounds < 1 or args.warmup < 0:
        parser.error("--requests and --rounds must be at least 1, --warmup at least 0")
    if args.turns < 0 or (args.turns and args.dialect != "chat"):
        parser.error("--turns is a count of chat messages: at least 0, with the chat dialect")
    if args.floor and (not args.upstream or args.dialect != "chat"):
        parser.error(
            "--floor passes chat completions through to nginx: it needs --upstream and the chat dialect"
        )
    needed = ["valgrind", "callgrind_control"] + (["nginx"] if args.upstream and not args.paced else [])
    if missing := [tool for tool in needed if shutil.which(tool) is None]:
        print(
            f"bench.instructions needs {', '.join(missing)} (Debian: apt-get install valgrind)",
            file=sys.stderr,
        )
        return 2
    with tempfile.TemporaryDirectory(prefix="chatgate-instructions-") as tmp:
        report(args, measure(args, Path(tmp)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
