"""Prometheus metrics (names per Prometheus conventions; OpenTelemetry GenAI names where they fit).

One process (the usual): a request adds to plain numbers (counts, a histogram's bucket counts)
and /metrics renders them when it is scraped; prometheus_client's metric objects would take a
lock and check their labels on every change. Several worker processes (`--workers N`, the
settings' environment names PROMETHEUS_MULTIPROC_DIR): the values live in prometheus_client's
shared files, written as they change, and /metrics adds up every worker's.

Each app has its own values (its own registry).
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.multiprocess import MultiProcessCollector

from gateway.core.errors import GatewayError
from gateway.telemetry.record import RequestRecord


class ReplicaHealth(Protocol):
    """What the health gauge reads of a replica (gateway/fleet/router.py's Replica)."""

    @property
    def name(self) -> str: ...

    @property
    def healthy(self) -> bool: ...


LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
Labels = tuple[str, ...]


@dataclass(frozen=True, slots=True, eq=False)
class Family:
    """A metric as /metrics shows it: its name, what it counts, its labels.

    Each is one of the constants below, so it is its own identity: equal and hashed as an object
    (in C), not field by field (a generated `__hash__`, asked several times a request)."""

    name: str
    documentation: str
    labels: Labels
    kind: Literal["counter", "gauge", "histogram"]
    multiprocess_mode: str = ""  # a gauge's way of adding up the workers' values


REQUESTS = Family(
    "chatgate_requests",
    "Requests answered, by dialect, deployment, key, route (the operation's path as mounted; "
    "`unmatched` for a path nothing serves) and status.",
    ("dialect", "deployment", "key", "route", "status"), "counter",
)  # fmt: skip
ERRORS = Family(
    "chatgate_request_errors",
    "Requests that ended in an error, by its code: refused with a status, or a stream that failed "
    "after its 200 (then the status stays 200 and the code says how it ended).",
    ("dialect", "deployment", "code"), "counter",
)  # fmt: skip
DURATION = Family(
    "chatgate_request_duration_seconds", "Time from request to the last byte of the answer.",
    ("dialect", "deployment"), "histogram",
)  # fmt: skip
TTFT = Family(
    "gen_ai_server_time_to_first_token_seconds",
    "Time to the first generated token (OpenTelemetry gen_ai.server.time_to_first_token).",
    ("dialect", "deployment"), "histogram",
)  # fmt: skip
TOKENS = Family(
    "chatgate_usage_tokens", "Tokens used, by key, deployment and type (input or output).",
    ("key", "deployment", "type"), "counter",
)  # fmt: skip
COST = Family(
    "chatgate_usage_cost", "What the tokens cost, by key and deployment (deployments' `price`).",
    ("key", "deployment"), "counter",
)  # fmt: skip
UPSTREAM_ERRORS = Family(
    "chatgate_upstream_errors", "Failures of upstream replicas, by kind (HTTP status class).",
    ("deployment", "replica", "kind"), "counter",
)  # fmt: skip
RETRIES = Family(
    "chatgate_retries", "Retries and fallbacks made before the first byte.", ("deployment",), "counter"
)
PANIC_ROUTED = Family(
    "chatgate_panic_routed",
    "Tries sent to an ejected replica because every replica of the deployment was ejected.",
    ("deployment",), "counter",
)  # fmt: skip
RATE_LIMITED = Family(
    "chatgate_rate_limited", "Requests refused by a rate limit, by kind (requests or tokens).",
    ("kind",), "counter",
)  # fmt: skip
IN_FLIGHT = Family(
    "chatgate_requests_in_flight", "Chat API requests being answered now.", (), "gauge", "livesum"
)
QUEUED = Family(
    "chatgate_requests_queued",
    "Requests waiting for a replica of the deployment with room (concurrency.max_concurrent).",
    ("deployment",), "gauge", "livesum",
)  # fmt: skip
HEALTHY = Family(
    "chatgate_replica_healthy", "1 when the replica is healthy, 0 while it is ejected.",
    ("deployment", "replica"), "gauge", "livemin",
)  # fmt: skip
AFFINITY = Family(
    "chatgate_route_affinity",
    "Picks of a deployment with prefix affinity: `hit` (the replica holding the prompt's longest "
    "prefix), `miss` (no replica held any), `overridden` (it was overloaded, full or ejected).",
    ("deployment", "outcome"), "counter",
)  # fmt: skip
LOG_LINES_DROPPED = Family(
    "chatgate_log_lines_dropped", "Log lines dropped because their reader stopped reading.", (), "counter"
)
FAMILIES = (
    REQUESTS, ERRORS, DURATION, TTFT, TOKENS, COST, UPSTREAM_ERRORS, RETRIES, PANIC_ROUTED, RATE_LIMITED,
    IN_FLIGHT, QUEUED, HEALTHY, AFFINITY, LOG_LINES_DROPPED,
)  # fmt: skip


def metrics_for(multiprocess: bool = False) -> Metrics:
    """The metrics of one app: plain numbers in one process; shared files under several
    (`multiprocess`: PROMETHEUS_MULTIPROC_DIR is set)."""
    return SharedFiles() if multiprocess else PlainNumbers()


class Metrics:
    """What the gateway records, in the metrics' terms; a subclass keeps the values."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.shown_health: dict[tuple[str, str], int] = {}

    def add(self, family: Family, labels: Labels, amount: float = 1) -> None:
        raise NotImplementedError

    def set(self, family: Family, labels: Labels, value: float) -> None:
        raise NotImplementedError

    def observe(self, family: Family, labels: Labels, seconds: float) -> None:
        raise NotImplementedError

    def exposition(self) -> bytes:
        raise NotImplementedError

    def started(self) -> None:
        self.add(IN_FLIGHT, (), 1)

    def finished(self, trace: RequestRecord, seconds: float) -> None:
        add = self.add
        add(IN_FLIGHT, (), -1)
        dialect = trace.dialect or "none"
        deployment = trace.deployment or "none"
        key = trace.key or "none"
        add(REQUESTS, (dialect, deployment, key, trace.route or "none", str(trace.status)))
        if trace.error_code:
            add(ERRORS, (dialect, deployment, trace.error_code))
        self.observe(DURATION, (dialect, deployment), seconds)
        if trace.ttft is not None:
            self.observe(TTFT, (dialect, deployment), trace.ttft)
        if trace.prompt_tokens:
            add(TOKENS, (key, deployment, "input"), trace.prompt_tokens)
        if trace.completion_tokens:
            add(TOKENS, (key, deployment, "output"), trace.completion_tokens)
        if trace.cost:
            add(COST, (key, deployment), trace.cost)
        if trace.rate_limited:
            add(RATE_LIMITED, (trace.rate_limited,))

    def upstream_error(self, deployment: str, replica: str, error: GatewayError) -> None:
        self.add(UPSTREAM_ERRORS, (deployment, replica, str(error.status)))

    def panic(self, deployment: str) -> None:
        self.add(PANIC_ROUTED, (deployment,))

    def retry(self, deployment: str) -> None:
        self.add(RETRIES, (deployment,))

    def waiting(self, deployment: str, change: int) -> None:
        """One more (+1) or one fewer (-1) request waiting for a replica with room."""
        self.add(QUEUED, (deployment,), change)

    def replica_health(self, deployment: str, replica: ReplicaHealth) -> None:
        """Set the gauge when the replica's health differs from what it last showed."""
        healthy = 1 if replica.healthy else 0
        key = (deployment, replica.name)
        if self.shown_health.get(key) != healthy:
            self.shown_health[key] = healthy
            self.set(HEALTHY, key, healthy)

    def affinity(self, deployment: str, outcome: str) -> None:
        self.add(AFFINITY, (deployment, outcome))

    def log_line_dropped(self) -> None:
        self.add(LOG_LINES_DROPPED, ())


class Timings:
    """A histogram's values for one label set: the count in each bucket (not cumulative), and
    the sum."""

    __slots__ = ("counts", "sum")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BUCKETS) + 1)  # the last: past the largest bound
        self.sum = 0.0

    def cumulative(self) -> list[tuple[str, float]]:
        found, total = [], 0
        for bound, count in zip((*map(str, map(float, LATENCY_BUCKETS)), "+Inf"), self.counts, strict=True):
            total += count
            found.append((bound, float(total)))
        return found


class PlainNumbers(Metrics):
    """One process: plain numbers, rendered at scrape time."""

    def __init__(self) -> None:
        super().__init__()
        self.values: dict[Family, dict[Labels, float]] = {family: {} for family in FAMILIES}
        self.timings: dict[Family, dict[Labels, Timings]] = {DURATION: {}, TTFT: {}}
        self.values[IN_FLIGHT][()] = 0
        self.created = time.time()
        self.registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=self.registry)  # the process's memory, CPU and open files
        self.registry.register(self)

    def add(self, family: Family, labels: Labels, amount: float = 1) -> None:
        values = self.values[family]
        values[labels] = values.get(labels, 0) + amount

    def set(self, family: Family, labels: Labels, value: float) -> None:
        self.values[family][labels] = value

    def observe(self, family: Family, labels: Labels, seconds: float) -> None:
        timings = self.timings[family].get(labels)
        if timings is None:
            timings = self.timings[family][labels] = Timings()
        timings.counts[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
        timings.sum += seconds

    def describe(self) -> list[Metric]:
        return []  # nothing to check against other collectors at registration

    def collect(self) -> Iterator[Metric]:
        """The families as they stand (prometheus_client's collector protocol, at scrape time)."""
        for family in FAMILIES:
            labels = list(family.labels)
            if family.kind == "histogram":
                histogram = HistogramMetricFamily(family.name, family.documentation, labels=labels)
                for values, timings in list(self.timings[family].items()):
                    histogram.add_metric(list(values), timings.cumulative(), timings.sum)
                yield histogram
                continue
            if family.kind == "counter":
                counter = CounterMetricFamily(family.name, family.documentation, labels=labels)
                for values, value in list(self.values[family].items()):
                    counter.add_metric(list(values), value, created=self.created)
                yield counter
                continue
            gauge = GaugeMetricFamily(family.name, family.documentation, labels=labels)
            for values, value in list(self.values[family].items()):
                gauge.add_metric(list(values), value)
            yield gauge

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class SharedFiles(Metrics):
    """Several worker processes: prometheus_client's metrics, whose values live in the shared
    files it keeps in PROMETHEUS_MULTIPROC_DIR, added up over the workers at scrape time."""

    def __init__(self) -> None:
        super().__init__()
        self.registry = CollectorRegistry(auto_describe=True)
        self.metrics: dict[Family, MetricWrapperBase] = {family: self.made(family) for family in FAMILIES}
        self.children: dict[tuple[Any, ...], Any] = {}

    def made(self, family: Family) -> MetricWrapperBase:
        labels = family.labels
        if family.kind == "counter":
            return Counter(family.name, family.documentation, labels, registry=self.registry)
        if family.kind == "histogram":
            return Histogram(
                family.name, family.documentation, labels, buckets=LATENCY_BUCKETS, registry=self.registry
            )
        return Gauge(
            family.name, family.documentation, labels, registry=self.registry,
            multiprocess_mode=family.multiprocess_mode,  # type: ignore[arg-type]
        )  # fmt: skip

    def child(self, family: Family, labels: Labels) -> Any:
        """The metric's child for these labels, looked up once: `labels` takes a lock and checks
        its arguments on every call. Label values are few here (dialects, deployments, replicas,
        statuses), so the children are kept."""
        key = (family, *labels)
        found = self.children.get(key)
        if found is None:
            metric = self.metrics[family]
            found = self.children[key] = metric.labels(*labels) if labels else metric
        return found

    def add(self, family: Family, labels: Labels, amount: float = 1) -> None:
        self.child(family, labels).inc(amount)

    def set(self, family: Family, labels: Labels, value: float) -> None:
        self.child(family, labels).set(value)

    def observe(self, family: Family, labels: Labels, seconds: float) -> None:
        self.child(family, labels).observe(seconds)

    def exposition(self) -> bytes:
        registry = CollectorRegistry()
        MultiProcessCollector(registry)
        return generate_latest(registry)
