"""What each replica's server says of its own load, read from its Prometheus /metrics in the
background (a deployment's `routing.load_from: metrics`): the requests it runs, those it queues,
and how full its KV cache is, under the names vLLM, llama.cpp's server and TGI publish.

One task a replica reads its /metrics every `scrape_interval` seconds, each read bounded by
`scrape_timeout`; the tasks start and stop with the app (its lifespan). Between two reads the
gateway's own count fills the gap: the requests it sent the replica since the read are added,
those that ended since are taken off. A replica with no good read for `stale_after` intervals is
weighed by the gateway's count alone, as without metrics; it never leaves the fleet for it.

A failed read is logged once when it starts failing and once when it reads again, by replica
name: never the URL (it may carry a password) nor the key sent with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit, urlunsplit

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

log = logging.getLogger("chatgate.fleet")

# The gauges read, by what they say; a server publishes one name of each (or none: llama.cpp's
# server and TGI have no KV-cache gauge).
RUNNING = (
    "vllm:num_requests_running",  # vLLM
    "llamacpp:requests_processing",  # llama.cpp's server (`--metrics`)
    "tgi_batch_current_size",  # TGI
)
WAITING = ("vllm:num_requests_waiting", "llamacpp:requests_deferred", "tgi_queue_size")
KV_CACHE = ("vllm:kv_cache_usage_perc",)  # 0 to 1
READ = frozenset((*RUNNING, *WAITING, *KV_CACHE))
# A request queued at the server has all of its work ahead of it, behind the running ones.
WAITING_WEIGHT = 2.0


@dataclass(slots=True)
class ServerLoad:
    """One good read of a replica's /metrics."""

    running: float
    waiting: float
    kv_cache: float  # 0 to 1; 0 where the server does not say
    read_at: float = 0.0  # time.monotonic() of the read
    outstanding_then: int = 0  # the gateway's requests on the replica at the read

    def now(self, outstanding: int) -> float:
        """The load it has now, in requests: what it said, with the gateway's own requests
        begun (or ended) since, weighted up by how full its KV cache is (a replica with a full
        cache preempts or queues what it is sent)."""
        load = self.running + WAITING_WEIGHT * self.waiting + (outstanding - self.outstanding_then)
        return max(0.0, load) * (1.0 + self.kv_cache)


def relevant_lines(text: str) -> str:
    """The lines of the families read (a vLLM /metrics is tens of kilobytes of histograms)."""
    kept = []
    for line in text.splitlines():
        if line.startswith("#"):  # "# TYPE name gauge", "# HELP name ..."
            parts = line.split(None, 3)
            keep = len(parts) > 2 and parts[2] in READ
        else:  # "name{labels} value" or "name value"
            keep = line.split("{", 1)[0].split(" ", 1)[0] in READ
        if keep:
            kept.append(line)
    return "\n".join(kept) + "\n"


def parse_load(text: str, model: str | None = None) -> ServerLoad | None:
    """The load a /metrics page says, or None when it has none of the gauges read (not one of
    these servers, or llama.cpp's server without `--metrics`). A vLLM serving several models
    labels its series `model_name`: those of `model` count where it does."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(relevant_lines(text)):
        samples = [s for s in family.samples if s.name == family.name]
        named = [s for s in samples if model is not None and s.labels.get("model_name") == model]
        found[family.name] = sum(s.value for s in named or samples)
    if not any(name in found for name in (*RUNNING, *WAITING)):
        return None
    return ServerLoad(
        running=first_of(found, RUNNING),
        waiting=first_of(found, WAITING),
        kv_cache=min(1.0, max(0.0, first_of(found, KV_CACHE))),
    )


def first_of(found: dict[str, float], names: Iterable[str]) -> float:
    return next((found[name] for name in names if name in found), 0.0)


def metrics_url(base_url: str) -> str:
    """A server's /metrics from the base URL its chat API is under: vLLM's and llama.cpp's
    `http://host:port/v1` → `http://host:port/metrics`; TGI's `http://host:port` likewise."""
    parts = urlsplit(base_url.rstrip("/"))
    path = parts.path.removesuffix("/v1")
    return urlunsplit((parts.scheme, parts.netloc, f"{path}/metrics", "", ""))


class HasServerLoad(Protocol):
    """What the reader writes to (gateway/fleet/router.py's Replica)."""

    name: str
    outstanding: int
    server: ServerLoad | None


@dataclass(slots=True)
class Target:
    """One replica to read: where, with which headers (its key, where it has one)."""

    replica: HasServerLoad
    url: str
    headers: dict[str, str]


class LoadWatch:
    """The reading tasks of one deployment's replicas."""

    def __init__(
        self, targets: Sequence[Target], interval: float, timeout: float, model: str | None = None
    ) -> None:
        self.targets = targets
        self.interval = interval
        self.timeout = timeout
        self.model = model
        self.tasks: list[asyncio.Task[None]] = []
        self.session: aiohttp.ClientSession | None = None

    def start(self) -> None:
        """In the running event loop; again: nothing (a deployment a reload kept)."""
        if self.tasks:
            return
        self.session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=self.timeout),
            connector=aiohttp.TCPConnector(limit=len(self.targets) + 1),
        )
        loop = asyncio.get_running_loop()
        self.tasks = [loop.create_task(self.watch(target)) for target in self.targets]

    async def aclose(self) -> None:
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.tasks = []
        if self.session is not None:
            await self.session.close()
            self.session = None

    async def watch(self, target: Target) -> None:
        failing = False
        while True:
            began = time.monotonic()
            load = await self.read(target)
            if load is not None:
                load.read_at = time.monotonic()
                load.outstanding_then = target.replica.outstanding
                target.replica.server = load
                if failing:
                    log.info("replica %s: its /metrics answers again", target.replica.name)
                    failing = False
            elif not failing:
                log.warning(
                    "replica %s: no load read from its /metrics; weighing it by the gateway's own count",
                    target.replica.name,
                )
                failing = True
            await asyncio.sleep(max(0.0, self.interval - (time.monotonic() - began)))

    async def read(self, target: Target) -> ServerLoad | None:
        assert self.session is not None
        try:
            async with self.session.get(target.url, headers=target.headers, allow_redirects=False) as answer:
                if answer.status != 200:
                    return None
                text = await answer.text(errors="replace")
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError):
            return None
        try:
            return parse_load(text, self.model)
        except ValueError:  # not Prometheus' text format
            return None
