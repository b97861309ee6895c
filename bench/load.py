"""Load generators: wrk for request/response figures, small asyncio clients for streams.

wrk runs one thread (its core is shared with the upstream nginx) and reports through a Lua
`done` hook, so figures come from wrk's own counters, not from parsing its text. Every run
also counts socket errors and non-2xx answers: a figure with errors is not a figure.

A run can be capped at a request rate. wrk has no such option (wrk2 is not packaged here), but
its Lua hook `delay()` is asked before every request how many milliseconds to wait: the script
keeps one schedule of a slot every 1/rate seconds, and each request waits for the next free
slot. wrk's timers have a resolution of 1 ms, so requests leave on millisecond ticks, about
rate/1000 at a time. The rate actually reached is requests / duration, and the caller checks it.
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
# A schedule for a capped rate; wrk's LuaJIT reads the monotonic clock through its FFI
# (os.clock is CPU time and os.time has whole seconds).
RATE_LUA = """\
local ffi = require("ffi")
ffi.cdef[[
typedef struct { long tv_sec; long tv_nsec; } bench_timespec;
int clock_gettime(int clock_id, bench_timespec *now);
]]
local clock = ffi.new("bench_timespec")
local next_slot = nil

local function now_ms()
  ffi.C.clock_gettime(1, clock)  -- CLOCK_MONOTONIC
  return tonumber(clock.tv_sec) * 1000 + tonumber(clock.tv_nsec) / 1e6
end

function delay()
  local now = now_ms()
  next_slot = (next_slot or now) + interval_ms
  return math.max(0, next_slot - now)
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
    rate: float | None = None  # requests/s asked for; None: as fast as the server answers

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def lua_script(body: bytes, headers: dict[str, str], rate: float | None = None) -> str:
    lines = [f'wrk.headers["{name}"] = "{value}"' for name, value in headers.items()]
    script = LUA.format(body=body.decode(), headers="\n".join(lines), mark=RESULT_MARK)
    if rate is None:
        return script
    return f"local interval_ms = {1000 / rate!r}\n{RATE_LUA}{script}"


class WrkRun:
    """One wrk run, started at once in the background; `result()` waits for its figures.

    `seconds` is rounded to whole seconds (at least 1), as wrk takes them."""

    def __init__(
        self,
        url: str,
        body: bytes,
        headers: dict[str, str],
        connections: int,
        seconds: float,
        core: str | None,
        rate: float | None = None,
    ) -> None:
        self.connections = connections
        self.seconds = max(1, round(seconds))
        self.rate = rate
        with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
            script.write(lua_script(body, headers, rate))
        self.script = Path(script.name)
        command = [
            "wrk", "-t1", f"-c{connections}", f"-d{self.seconds}s",
            f"--timeout={WRK_TIMEOUT}", "-s", script.name, url,
        ]  # fmt: skip
        if core is not None:
            command = ["taskset", "-c", core, *command]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def result(self) -> WrkResult:
        try:
            stdout, stderr = self.process.communicate(timeout=self.seconds + 60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise
        finally:
            self.script.unlink(missing_ok=True)
        match = re.search(rf"^{RESULT_MARK} (.*)$", stdout, re.MULTILINE)
        if self.process.returncode != 0 or match is None:
            raise RuntimeError(f"wrk failed ({self.process.returncode}): {stdout[-500:]} {stderr[-500:]}")
        return parse_result(match.group(1), self.connections, self.rate)


def parse_result(line: str, connections: int, rate: float | None) -> WrkResult:
    """The figures the Lua `done` hook printed: counts, duration (µs) and percentiles (µs)."""
    requests, duration_us, connect, read, write, status, timeout, p50, p90, p99 = (
        int(float(x)) for x in line.split()
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
        rate=rate,
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


SSE_DONE = b"data: [DONE]"  # chat completions' last event: a sentinel, not a chunk


async def relay_rate(
    url: str,
    body: bytes,
    headers: dict[str, str],
    concurrency: int,
    seconds: float,
    done: bytes = SSE_DONE,
) -> RelayResult:
    """Many streams at once for `seconds`: the SSE data events received (chat's [DONE] not
    counted); a stream counts as whole when `done` (what its last event holds) arrived."""
    totals = {"streams": 0, "chunks": 0, "errors": 0}
    deadline = time.perf_counter() + seconds
    keep = max(len(done), 5) - 1  # the bytes a match may begin in, kept from the piece before
    sentinel = 1 if done == SSE_DONE else 0

    async def one_client(session: aiohttp.ClientSession) -> None:
        while time.perf_counter() < deadline:
            async with session.post(url, data=body) as response:
                if response.status != 200:
                    await response.read()
                    totals["errors"] += 1
                    continue
                tail, count, whole = b"", 0, False
                async for piece in response.content.iter_any():
                    joined = tail + piece  # "data:" is 5 bytes: a match never lies in the tail alone
                    count += joined.count(b"data:") - tail.count(b"data:")
                    whole = whole or done in joined
                    tail = joined[-keep:]
            if not whole:
                totals["errors"] += 1
                continue
            totals["streams"] += 1
            totals["chunks"] += count - sentinel

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
