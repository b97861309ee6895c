"""Prometheus metrics (names per Prometheus conventions; OpenTelemetry GenAI names where they fit).

Each app has its own registry. Under several worker processes (PROMETHEUS_MULTIPROC_DIR set,
as `chatgate serve --workers N` does) values live in shared files and /metrics aggregates them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.multiprocess import MultiProcessCollector

from gateway.core.errors import GatewayError
from gateway.record import RequestRecord

if TYPE_CHECKING:
    from gateway.router import Replica

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, multiprocess: bool = False) -> None:
        """`multiprocess`: PROMETHEUS_MULTIPROC_DIR is set (the settings' environment), and
        prometheus_client adds up the workers' metrics through the files it keeps there."""
        self.registry = CollectorRegistry(auto_describe=True)
        self.multiprocess = multiprocess
        registry = self.registry
        if not self.multiprocess:  # the process's memory, CPU and open files (one process)
            ProcessCollector(registry=registry)
        self.requests = Counter(
            "chatgate_requests", "Chat API requests answered, by dialect, deployment, key and status.",
            ["dialect", "deployment", "key", "status"], registry=registry,
        )  # fmt: skip
        self.errors = Counter(
            "chatgate_request_errors",
            "Requests that ended in an error, by its code: refused with a status, or a stream that "
            "failed after its 200 (then the status stays 200 and the code says how it ended).",
            ["dialect", "deployment", "code"], registry=registry,
        )  # fmt: skip
        self.duration = Histogram(
            "chatgate_request_duration_seconds", "Time from request to the last byte of the answer.",
            ["dialect", "deployment"], buckets=LATENCY_BUCKETS, registry=registry,
        )  # fmt: skip
        self.ttft = Histogram(
            "gen_ai_server_time_to_first_token_seconds",
            "Time to the first generated token (OpenTelemetry gen_ai.server.time_to_first_token).",
            ["dialect", "deployment"], buckets=LATENCY_BUCKETS, registry=registry,
        )  # fmt: skip
        self.tokens = Counter(
            "chatgate_usage_tokens", "Tokens used, by key, deployment and type (input or output).",
            ["key", "deployment", "type"], registry=registry,
        )  # fmt: skip
        self.cost = Counter(
            "chatgate_usage_cost", "What the tokens cost, by key and deployment (deployments' `price`).",
            ["key", "deployment"], registry=registry,
        )  # fmt: skip
        self.upstream_errors = Counter(
            "chatgate_upstream_errors", "Failures of upstream replicas, by kind (HTTP status class).",
            ["deployment", "replica", "kind"], registry=registry,
        )  # fmt: skip
        self.retries = Counter(
            "chatgate_retries", "Retries and fallbacks made before the first byte.",
            ["deployment"], registry=registry,
        )  # fmt: skip
        self.panic_routed = Counter(
            "chatgate_panic_routed",
            "Tries sent to an ejected replica because every replica of the deployment was ejected.",
            ["deployment"], registry=registry,
        )  # fmt: skip
        self.rate_limited = Counter(
            "chatgate_rate_limited", "Requests refused by a rate limit, by kind (requests or tokens).",
            ["kind"], registry=registry,
        )  # fmt: skip
        self.in_flight = Gauge(
            "chatgate_requests_in_flight", "Chat API requests being answered now.",
            registry=registry, multiprocess_mode="livesum",
        )  # fmt: skip
        self.queued = Gauge(
            "chatgate_requests_queued",
            "Requests waiting for a replica of the deployment with room (concurrency.max_concurrent).",
            ["deployment"], registry=registry, multiprocess_mode="livesum",
        )  # fmt: skip
        self.healthy = Gauge(
            "chatgate_replica_healthy", "1 when the replica is healthy, 0 while it is ejected.",
            ["deployment", "replica"], registry=registry, multiprocess_mode="livemin",
        )  # fmt: skip
        self.log_lines_dropped = Counter(
            "chatgate_log_lines_dropped", "Log lines dropped because their reader stopped reading.",
            registry=registry,
        )  # fmt: skip
        self.shown_health: dict[tuple[str, str], int] = {}
        self.children: dict[tuple[Any, ...], Any] = {}

    def child(self, metric: MetricWrapperBase, *values: str) -> Any:
        """`metric.labels(*values)`, looked up once: `labels` takes a lock and checks its
        arguments on every call, which was a tenth of a request's CPU. Label values are few here
        (dialects, deployments, replicas, statuses), so the children are kept."""
        key = (metric, *values)
        found = self.children.get(key)
        if found is None:
            found = self.children[key] = metric.labels(*values)
        return found

    def started(self) -> None:
        self.in_flight.inc()

    def finished(self, trace: RequestRecord, seconds: float) -> None:
        self.in_flight.dec()
        deployment = trace.deployment or "none"
        key = trace.key or "none"
        self.child(self.requests, trace.dialect, deployment, key, str(trace.status)).inc()
        if trace.error_code:
            self.child(self.errors, trace.dialect, deployment, trace.error_code).inc()
        self.child(self.duration, trace.dialect, deployment).observe(seconds)
        if trace.ttft is not None:
            self.child(self.ttft, trace.dialect, deployment).observe(trace.ttft)
        if trace.prompt_tokens:
            self.child(self.tokens, key, deployment, "input").inc(trace.prompt_tokens)
        if trace.completion_tokens:
            self.child(self.tokens, key, deployment, "output").inc(trace.completion_tokens)
        if trace.cost:
            self.child(self.cost, key, deployment).inc(trace.cost)
        if trace.rate_limited:
            self.child(self.rate_limited, trace.rate_limited).inc()

    def upstream_error(self, deployment: str, replica: str, error: GatewayError) -> None:
        self.child(self.upstream_errors, deployment, replica, str(error.status)).inc()

    def panic(self, deployment: str) -> None:
        self.child(self.panic_routed, deployment).inc()

    def retry(self, deployment: str) -> None:
        self.child(self.retries, deployment).inc()

    def waiting(self, deployment: str, change: int) -> None:
        """One more (+1) or one fewer (-1) request waiting for a replica with room."""
        self.child(self.queued, deployment).inc(change)

    def replica_health(self, deployment: str, replica: Replica) -> None:
        """Set the gauge when the replica's health differs from what it last showed."""
        healthy = 1 if replica.healthy else 0
        key = (deployment, replica.name)
        if self.shown_health.get(key) != healthy:
            self.shown_health[key] = healthy
            self.child(self.healthy, deployment, replica.name).set(healthy)

    def exposition(self) -> bytes:
        if self.multiprocess:
            registry = CollectorRegistry()
            MultiProcessCollector(registry)
            return generate_latest(registry)
        return generate_latest(self.registry)
