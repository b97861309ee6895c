"""Load generators: wrk for request/response figures, small asyncio clients for streams.

wrk runs one thread (its core is shared with the upstream nginx) and reports through a Lua
`done` hook, so figures come from wrk's own counters, not from parsing its text. Every run
also counts socket errors and non-2xx answers: a figure with errors is not a figure.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson

WRK_TIMEOUT = "10s"  # a request slower than this counts as a timeout error
RESULT_MARK = "BENCH_RESULT"
LUA = """\
wrk.method = "POST"
wrk.body = [==[{body}]==]
{headers}
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("{mark} %d %d %d %d %d %d %d %d %d %d\\n",
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99)))
end
"""


@dataclass(frozen=True)
class WrkResult:
    connections: int
    requests: int
    seconds: float
    rps: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    errors: int  # connect/read/write/timeout errors plus non-2xx/3xx answers

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def lua_script(body: bytes, headers: dict[str, str]) -> str:
    lines = [f'wrk.headers["{name}"] = "{value}"' for name, value in headers.items()]
    return LUA.format(body=body.decode(), headers="\n".join(lines), mark=RESULT_MARK)


def wrk(
    url: str,
    body: bytes,
    headers: dict[str, str],
    connections: int,
    seconds: float,
    core: str | None,
) -> WrkResult:
    """One wrk run of `seconds` (whole seconds, at least 1)."""
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(lua_script(body, headers))
    command = [
        "wrk", "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s",
        f"--timeout={WRK_TIMEOUT}", "-s", script.name, url,
    ]  # fmt: skip
    if core is not None:
        command = ["taskset", "-c", core, *command]
    try:
        run = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 60)
    finally:
        Path(script.name).unlink(missing_ok=True)
    match = re.search(rf"^{RESULT_MARK} (.*)$", run.stdout, re.MULTILINE)
    if run.returncode != 0 or match is None:
        raise RuntimeError(f"wrk failed ({run.returncode}): {run.stdout[-500:]} {run.stderr[-500:]}")
    requests, duration_us, connect, read, write, status, timeout, p50, p90, p99 = (
        int(float(x)) for x in match.group(1).split()
    )
    seconds_run = duration_us / 1e6
    return WrkResult(
        connections=connections,
        requests=requests,
        seconds=round(seconds_run, 3),
        rps=requests / seconds_run if seconds_run else 0.0,
        p50_ms=p50 / 1000,
        p90_ms=p90 / 1000,
        p99_ms=p99 / 1000,
        errors=connect + read + write + status + timeout,
    )


# ----- streams ------------------------------------------------------------------------------


@dataclass(frozen=True)
class FirstChunkResult:
    streams: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    min_ms: float

    @classmethod
    def of(cls, times: list[float]) -> FirstChunkResult:
        return cls(
            streams=len(times),
            p50_ms=percentile(times, 0.50),
            p90_ms=percentile(times, 0.90),
            p99_ms=percentile(times, 0.99),
            min_ms=min(times),
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RelayResult:
    concurrency: int
    seconds: float
    streams: int
    chunks: int
    chunks_per_s: float
    chunks_per_stream: float
    errors: int
    client_cpu: float  # share of one core the client itself used: near 1.0 means it was the limit

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(share * (len(ordered) - 1))))]


def has_content(line: bytes) -> bool:
    """Whether an SSE line is a chunk carrying generated text (not the role-only opener)."""
    if not line.startswith(b"data:") or line.strip() == b"data: [DONE]":
        return False
    try:
        chunk = orjson.loads(line[5:])
    except orjson.JSONDecodeError:
        return False
    return any((choice.get("delta") or {}).get("content") for choice in chunk.get("choices") or ())


async def first_chunk_times(
    url: str, body: bytes, headers: dict[str, str], streams: int, warmup: int = 10
) -> list[float]:
    """Time from sending a streamed request to reading its first content chunk, one stream at a
    time over one kept-alive connection; each stream is read to its end before the next."""
    times: list[float] = []
    connector = aiohttp.TCPConnector(limit=1)
    async with aiohttp.ClientSession(connector=connector, headers=headers) as session:
        for number in range(warmup + streams):
            started = time.perf_counter()
            first = None
            async with session.post(url, data=body) as response:
                if response.status != 200:
                    raise RuntimeError(f"{url}: {response.status} {(await response.read())[:300]!r}")
                async for line in response.content:
                    if first is None and has_content(line):
                        first = time.perf_counter() - started
            if first is None:
                raise RuntimeError(f"{url}: a stream without a content chunk")
            if number >= warmup:
                times.append(first * 1000)
    return times


async def relay_rate(
    url: str, body: bytes, headers: dict[str, str], concurrency: int, seconds: float
) -> RelayResult:
    """Many streams at once for `seconds`: chunks (SSE data events, [DONE] excluded) received."""
    totals = {"streams": 0, "chunks": 0, "errors": 0}
    deadline = time.perf_counter() + seconds

    async def one_client(session: aiohttp.ClientSession) -> None:
        while time.perf_counter() < deadline:
            async with session.post(url, data=body) as response:
                if response.status != 200:
                    await response.read()
                    totals["errors"] += 1
                    continue
                tail, count, last = b"", 0, b""
                async for piece in response.content.iter_any():
                    joined = tail + piece  # "data:" is 5 bytes: a match never lies in the tail alone
                    count += joined.count(b"data:")
                    tail = joined[-4:]
                    last = (last + piece)[-32:]
            if b"[DONE]" not in last:
                totals["errors"] += 1
                continue
            totals["streams"] += 1
            totals["chunks"] += count - 1

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, headers=headers) as session:
        cpu_started, started = time.process_time(), time.perf_counter()
        await asyncio.gather(*(one_client(session) for _ in range(concurrency)))
        wall = time.perf_counter() - started
        cpu = time.process_time() - cpu_started
    return RelayResult(
        concurrency=concurrency,
        seconds=round(wall, 3),
        streams=totals["streams"],
        chunks=totals["chunks"],
        chunks_per_s=totals["chunks"] / wall,
        chunks_per_stream=totals["chunks"] / totals["streams"] if totals["streams"] else 0.0,
        errors=totals["errors"],
        client_cpu=cpu / wall,
    )
