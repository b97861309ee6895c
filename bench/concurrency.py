"""The concurrency point: thousands of slow streams open at once through one worker, as an
engine's clients hold them (64 chunks, 20 ms apart, from bench.slow_upstream).

Each stream's client notes when each piece with data arrives; the gaps between pieces, past
the first, are the stream's pace. The same streams read straight from the upstream give the
pace without chatgate; the added p99 gap is the difference (none when the direct run itself fell
behind: then the load core, not chatgate, set the pace). While chatgate relays them its RSS is
read every 0.2 s: at the sample with the most streams open, the RSS less the RSS before, over
those streams, is the memory an open stream holds.
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import resource
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import aiohttp

from bench.load import percentile

STREAMS = (1_000, 4_000, 8_000)
SMOKE_STREAMS = (50,)
GAP_MS = 20
AT_PACE = 2.0  # a direct run whose p99 gap is past this many GAP_MS did not keep the pace
RAMP_SECONDS = 1.0  # the streams are opened over this time (a listen backlog takes a burst badly)
RSS_EVERY = 0.2
SETTLE_SECONDS = 2.0  # after the last stream, before "RSS after"
STREAM_TIMEOUT = 300.0


@dataclass(frozen=True)
class StreamsResult:
    streams: int
    ok: int
    errors: int
    error_kinds: dict[str, int]
    chunks: int  # data events received ([DONE] excluded)
    seconds: float
    peak_open: int  # streams open at once, at most
    gap_p50_ms: float
    gap_p99_ms: float
    client_cpu: float  # share of one core the client used: near 1.0, the client was the limit

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


async def streams_at_once(
    url: str,
    body: bytes,
    count: int,
    on_sample: Callable[[int], None] | None = None,
) -> StreamsResult:
    """`count` streams opened over RAMP_SECONDS, each read to its end; `on_sample(open)` is
    called every RSS_EVERY seconds with the streams open then."""
    gaps: list[float] = []
    errors: dict[str, int] = {}
    totals = {"ok": 0, "chunks": 0, "open": 0, "peak": 0}

    def failed(kind: str) -> None:
        errors[kind] = errors.get(kind, 0) + 1

    async def one(session: aiohttp.ClientSession, delay: float) -> None:
        await asyncio.sleep(delay)
        totals["open"] += 1
        totals["peak"] = max(totals["peak"], totals["open"])
        try:
            async with session.post(url, data=body) as response:
                if response.status != 200:
                    await response.read()
                    failed(f"HTTP {response.status}")
                    return
                count, tail, last_seen, times = 0, b"", b"", []
                async for piece in response.content.iter_any():
                    times.append(time.perf_counter())
                    joined = tail + piece  # "data:" is 5 bytes: a match never lies in the tail alone
                    count += joined.count(b"data:")
                    tail = joined[-4:]
                    last_seen = (last_seen + piece)[-64:]
            if b"[DONE]" not in last_seen or b'"error"' in last_seen:
                failed("stream ended without [DONE]")
                return
            totals["ok"] += 1
            totals["chunks"] += count - 1
            gaps.extend(later - earlier for earlier, later in itertools.pairwise(times[1:]))
        except (aiohttp.ClientError, TimeoutError) as error:
            failed(error_kind(error))
        finally:
            totals["open"] -= 1

    async def sample(done: asyncio.Event) -> None:
        while not done.is_set():
            if on_sample is not None:
                on_sample(totals["open"])
            await asyncio.sleep(RSS_EVERY)

    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    timeout = aiohttp.ClientTimeout(total=STREAM_TIMEOUT)
    headers = {"content-type": "application/json"}
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, headers=headers) as session:
        done = asyncio.Event()
        sampler = asyncio.create_task(sample(done))
        cpu, started = time.process_time(), time.perf_counter()
        await asyncio.gather(*(one(session, RAMP_SECONDS * i / count) for i in range(count)))
        wall = time.perf_counter() - started
        cpu = time.process_time() - cpu
        done.set()
        await sampler
    return StreamsResult(
        streams=count,
        ok=totals["ok"],
        errors=sum(errors.values()),
        error_kinds=errors,
        chunks=totals["chunks"],
        seconds=round(wall, 2),
        peak_open=totals["peak"],
        gap_p50_ms=percentile(gaps, 0.5) * 1000 if gaps else 0.0,
        gap_p99_ms=percentile(gaps, 0.99) * 1000 if gaps else 0.0,
        client_cpu=cpu / wall,
    )


def error_kind(error: BaseException) -> str:
    """The error's type, with its errno's name where it has one: a reset (ECONNRESET, a listen
    backlog overflowing) and a refusal (ECONNREFUSED) are both ClientOSError."""
    number = getattr(error, "errno", None)
    if not isinstance(number, int):
        return type(error).__name__
    return f"{type(error).__name__} {errno.errorcode.get(number, number)}"


def raise_open_files(wanted: int) -> None:
    """This process holds a socket per stream: the soft limit up to `wanted` (or the hard one)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))
