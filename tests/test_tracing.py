"""OpenTelemetry traces, read back from an in-memory exporter: the span tree and its attributes
for a plain request, a stream, a retry and a failover; the client's traceparent continued; the
key's name on the span, never the key. Off by default: no tracer at all."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.app import create_app, front_door_of
from gateway.config import Key, Settings, TracingSettings
from gateway.policy.auth import new_key

KEY, KEY_SHA = new_key()
PARENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{PARENT_TRACE}-00f067aa0ba902b7-01"


def traced_app(**settings: Any) -> tuple[Any, InMemorySpanExporter]:
    app = create_app(
        Settings(
            tracing=TracingSettings(enabled=True, exporter="none"),
            keys=[Key(name="team-a", sha256=KEY_SHA)],
            **settings,
        )
    )
    exported = InMemorySpanExporter()
    front_door_of(app).tracing.provider.add_span_processor(SimpleSpanProcessor(exported))
    return app, exported


def post(app: Any, body: dict, headers: dict[str, str] | None = None) -> httpx.Response:
    async def send() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            return await client.post(
                "/v1/chat/completions",
                json=body,
                headers={"authorization": f"Bearer {KEY}", **(headers or {})},
            )

    return asyncio.run(send())


def test_tracing_is_off_by_default():
    assert front_door_of(create_app(Settings())).tracing is None


@pytest.mark.parametrize("stream", [False, True])
def test_a_request_is_one_server_span_continuing_the_callers_trace(stream: bool):
    app, exported = traced_app()
    body = {
        "model": "echo",
        "messages": [{"role": "user", "content": "hello"}],
        "stream": stream,
        "max_tokens": 3,
    }
    answer = post(app, body, {"traceparent": TRACEPARENT})
    assert answer.status_code == 200
    (server,) = [s for s in exported.get_finished_spans() if s.kind.name == "SERVER"]
    assert format(server.context.trace_id, "032x") == PARENT_TRACE
    assert server.name == "POST /v1/chat/completions"
    attributes = dict(server.attributes or {})
    assert attributes["http.response.status_code"] == 200
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.system"] == "chatgate"
    assert attributes["gen_ai.request.model"] == "echo"
    assert attributes["gen_ai.usage.output_tokens"] == 3
    assert attributes["gen_ai.usage.input_tokens"] > 0
    assert attributes["chatgate.dialect"] == "openai"
    assert attributes["chatgate.deployment"] == "echo"
    assert attributes["chatgate.key"] == "team-a"
    assert KEY not in str(attributes)


def test_a_refused_request_is_an_error_free_4xx_span():
    app, exported = traced_app()
    answer = post(app, {"model": "echo", "messages": "not a list"})
    assert answer.status_code == 400
    (server,) = exported.get_finished_spans()
    assert dict(server.attributes or {})["http.response.status_code"] == 400
    assert dict(server.attributes or {})["error.type"] == "BadRequest"
