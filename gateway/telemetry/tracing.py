"""OpenTelemetry traces, off unless asked for (`tracing.enabled: true`, or the standard
`OTEL_TRACES_EXPORTER` variable set to something else than `none`).

One server span per request (its parent from the client's W3C `traceparent`, if any) and one
client span per attempt at an upstream, so retries and fallbacks show as siblings. Attributes
follow OpenTelemetry's GenAI conventions (`gen_ai.operation.name`, `gen_ai.system`,
`gen_ai.request.model`, `gen_ai.usage.input_tokens` …) plus chatgate's own (`chatgate.dialect`,
`chatgate.deployment`, `chatgate.replica`, `chatgate.key` — the key's name, never the key).
Spans go to an OTLP exporter configured by the standard `OTEL_EXPORTER_OTLP_*` variables.

Off, nothing here runs: callers hold `None` and test for it once per request or attempt. On,
a request that is not sampled (its caller's `traceparent` says so, or `sample_ratio` drew it out)
gets no span at all, decided before the SDK is asked: the SDK's unsampled spans still cost a
third of a traced one. Such a request's upstream gets the caller's `traceparent` as it came.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
from typing import TYPE_CHECKING, Any

from gateway.config.environment import Environment
from gateway.config.settings import TracingSettings
from gateway.core.trace import TRACEPARENT

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

    from gateway.telemetry.record import RequestRecord

# Seconds a shutdown waits for the exporter to send what it holds: a collector that does not
# answer must hold up neither a reload nor SIGTERM (the spans it would not take are dropped).
SHUTDOWN_SECONDS = 2.0

# what each backend kind is, in gen_ai.system's words
GEN_AI_SYSTEMS = {
    "openai-compatible": "openai",
    "tgi": "huggingface_tgi",
    "local": "transformers",
    "echo": "chatgate",
}


def wanted(settings: TracingSettings, environment: Environment) -> bool:
    return settings.enabled or environment.tracing_asked


class Tracing:
    def __init__(self, settings: TracingSettings, environment: Environment) -> None:
        from opentelemetry.propagators.textmap import DefaultGetter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased
        from opentelemetry.trace import SpanKind
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        resource = Resource.create({"service.name": environment.service_name or settings.service_name})
        self.sample_ratio = settings.sample_ratio
        # sampled() has decided before a span is started: the SDK keeps what it is given
        # shut down by aclose(), bounded: the SDK's own exit hook waits on the exporter unbounded
        self.provider = TracerProvider(
            resource=resource, sampler=ParentBased(ALWAYS_ON), shutdown_on_exit=False
        )
        if settings.exporter == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        elif settings.exporter == "console":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            self.provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
        self.tracer: Tracer = self.provider.get_tracer("chatgate")
        self.propagator = TraceContextTextMapPropagator()
        self.getter = DefaultGetter()
        self.server_kind, self.client_kind = SpanKind.SERVER, SpanKind.CLIENT

    def sampled(self, traceparent: str | None) -> bool:
        """ParentBased(TraceIdRatioBased), decided cheaply: a well-formed parent's sampled flag,
        else a draw at `sample_ratio`."""
        if traceparent is not None and TRACEPARENT.match(traceparent):
            return bool(int(traceparent[-2:], 16) & 1)
        return self.sample_ratio >= 1 or random.random() < self.sample_ratio

    def server_span(
        self, method: str, path: str, raw_headers: list[tuple[bytes, bytes]], request_id: str
    ) -> Span | None:
        """The request's server span, None when it is not sampled."""
        headers = {
            name.decode("latin-1"): value.decode("latin-1")
            for name, value in raw_headers
            if name in (b"traceparent", b"tracestate")
        }
        if not self.sampled(headers.get("traceparent")):
            return None
        parent = self.propagator.extract(headers, getter=self.getter)  # the client's traceparent
        return self.tracer.start_span(
            f"{method} {path}",
            context=parent,
            kind=self.server_kind,
            attributes={"http.request.method": method, "url.path": path, "chatgate.request_id": request_id},
        )

    def client_span(self, parent: Span, deployment: str, replica: str, backend: str, model: str) -> Span:
        from opentelemetry.trace import set_span_in_context

        return self.tracer.start_span(
            f"chat {model}",
            context=set_span_in_context(parent),
            kind=self.client_kind,
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.system": GEN_AI_SYSTEMS.get(backend, backend),
                "gen_ai.request.model": model,
                "chatgate.deployment": deployment,
                "chatgate.replica": replica,
            },
        )

    def traceparent(self, span: Span) -> dict[str, str]:
        """The W3C headers that carry `span` to an upstream."""
        from opentelemetry.trace import set_span_in_context

        carrier: dict[str, str] = {}
        self.propagator.inject(carrier, context=set_span_in_context(span))
        return carrier

    @staticmethod
    def end_server_span(span: Span, record: RequestRecord) -> None:
        from opentelemetry.trace import Status, StatusCode

        attributes: dict[str, Any] = {
            "http.response.status_code": record.status,
            "gen_ai.operation.name": "chat",
            "chatgate.dialect": record.dialect,
            "chatgate.deployment": record.deployment,
            "chatgate.replica": record.replica,
            "chatgate.key": record.key,
            "chatgate.retries": record.retries,
            "gen_ai.usage.input_tokens": record.prompt_tokens,
            "gen_ai.usage.output_tokens": record.completion_tokens,
        }
        if record.model:
            attributes["gen_ai.request.model"] = record.model
        if record.backend:
            attributes["gen_ai.system"] = GEN_AI_SYSTEMS.get(record.backend, record.backend)
        span.set_attributes({k: v for k, v in attributes.items() if v not in ("", None)})
        if record.error_code:
            span.set_attribute("error.type", record.error_code)
        if record.status >= 500 or (record.error_code and record.status < 400):
            span.set_status(Status(StatusCode.ERROR, record.error_code or str(record.status)))
        span.end()

    async def aclose(self, timeout: float = SHUTDOWN_SECONDS) -> None:
        """Flush and shut the exporter down off the event loop, waiting at most `timeout`: the
        SDK's shutdown blocks until its exporter gives up (a hung collector: 10 s and more)."""
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def shut() -> None:
            try:
                self.provider.shutdown()
            finally:
                with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits any more
                    loop.call_soon_threadsafe(finished)

        def finished() -> None:
            if not done.done():
                done.set_result(None)

        # a daemon thread: one still waiting on the collector does not hold the process's exit
        threading.Thread(target=shut, name="chatgate-tracing-shutdown", daemon=True).start()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done, timeout)


def create_tracing(settings: TracingSettings, environment: Environment) -> Tracing | None:
    return Tracing(settings, environment) if wanted(settings, environment) else None
