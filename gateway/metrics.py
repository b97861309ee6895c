"""Prometheus metrics (names per Prometheus conventions; OpenTelemetry GenAI names where they fit).

Each app has its own registry. Under several worker processes (PROMETHEUS_MULTIPROC_DIR set,
as `chatgate serve --workers N` does) values live in shared files and /metrics aggregates them.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.multiprocess import MultiProcessCollector

from gateway.errors import GatewayError
from gateway.trace import RequestTrace

if TYPE_CHECKING:
    from gateway.router import Replica

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.multiprocess = bool(os.environ.get(MULTIPROC_ENV))
        registry = self.registry
        self.requests = Counter(
            "chatgate_requests", "Chat API requests answered, by dialect, deployment and status.",
            ["dialect", "deployment", "status"], registry=registry,
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
            "gen_ai_usage_tokens", "Tokens consumed, by deployment and type (input or output).",
            ["deployment", "type"], registry=registry,
        )  # fmt: skip
        self.upstream_errors = Counter(
            "chatgate_upstream_errors", "Failures of upstream replicas, by kind (HTTP status class).",
            ["deployment", "replica", "kind"], registry=registry,
        )  # fmt: skip
        self.retries = Counter(
            "chatgate_retries", "Retries and fallbacks made before the first byte.",
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
        self.healthy = Gauge(
            "chatgate_replica_healthy", "1 when the replica is healthy, 0 while it is ejected.",
            ["deployment", "replica"], registry=registry, multiprocess_mode="livemin",
        )  # fmt: skip

    def started(self) -> None:
        self.in_flight.inc()

    def finished(self, trace: RequestTrace, seconds: float) -> None:
        self.in_flight.dec()
        deployment = trace.deployment or "none"
        self.requests.labels(trace.dialect, deployment, str(trace.status)).inc()
        self.duration.labels(trace.dialect, deployment).observe(seconds)
        if trace.ttft is not None:
            self.ttft.labels(trace.dialect, deployment).observe(trace.ttft)
        if trace.prompt_tokens:
            self.tokens.labels(deployment, "input").inc(trace.prompt_tokens)
        if trace.completion_tokens:
            self.tokens.labels(deployment, "output").inc(trace.completion_tokens)
        if trace.rate_limited:
            self.rate_limited.labels(trace.rate_limited).inc()

    def upstream_error(self, deployment: str, replica: str, error: GatewayError) -> None:
        self.upstream_errors.labels(deployment, replica, str(error.status)).inc()

    def retry(self, deployment: str) -> None:
        self.retries.labels(deployment).inc()

    def replica_health(self, deployment: str, replica: Replica) -> None:
        self.healthy.labels(deployment, replica.name).set(1 if replica.healthy else 0)

    def exposition(self) -> bytes:
        if self.multiprocess:
            registry = CollectorRegistry()
            MultiProcessCollector(registry)
            return generate_latest(registry)
        return generate_latest(self.registry)
