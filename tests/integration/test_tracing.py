"""OpenTelemetry traces, read back from an in-memory exporter: the span tree and its attributes
for a plain request, a stream, a retry and a failover; the client's traceparent continued; the
key's name on the span, never the key. Off by default: no tracer at all."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.app import build_gateway, create_app
from gateway.config.settings import Key, Settings, TracingSettings
from gateway.policy.auth import new_key
from tests.support.fault_upstream import FaultUpstream
from tests.support.servers import free_port

KEY, KEY_SHA = new_key()
PARENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{PARENT_TRACE}-00f067aa0ba902b7-01"


def traced_app(**settings: Any) -> tuple[Any, InMemorySpanExporter]:
    gateway = build_gateway(
        Settings.model_validate(
            {
                "tracing": TracingSettings(enabled=True, exporter="none"),
                "keys": [Key(name="team-a", sha256=KEY_SHA)],
                **settings,
            }
        )
    )
    exported = InMemorySpanExporter()
    gateway.current.runtime.tracing.provider.add_span_processor(SimpleSpanProcessor(exported))
    return gateway.app, exported


def post(app: Any, body: dict, headers: dict[str, str] | None = None) -> httpx.Response:
    async def send() -> httpx.Response:
        async with LifespanManager(app) as started:
            transport = httpx.ASGITransport(app=started.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
                return await client.post(
                    "/v1/chat/completions",
                    json=body,
                    headers={"authorization": f"Bearer {KEY}", **(headers or {})},
                )

    return asyncio.run(send())


def test_tracing_is_off_by_default():
    assert build_gateway(Settings()).current.runtime.tracing is None


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


def upstream_deployment(name: str, urls: list[str], **settings: Any) -> dict[str, Any]:
    replicas = [{"name": f"r{i}", "options": {"base_url": url}} for i, url in enumerate(urls)]
    return {"name": name, "backend": "openai-compatible", "replicas": replicas, **settings}


def spans_by_kind(exported: InMemorySpanExporter) -> tuple[Any, list[Any]]:
    finished = exported.get_finished_spans()
    (server,) = [s for s in finished if s.kind.name == "SERVER"]
    clients = sorted((s for s in finished if s.kind.name == "CLIENT"), key=lambda s: s.start_time)
    return server, clients


@pytest.mark.parametrize("stream", [False, True])
def test_a_retry_is_two_client_spans_and_the_upstream_continues_the_second(stream: bool):
    with FaultUpstream() as upstream:
        # two replicas: a 5xx is tried again on another replica, never on the one that gave it
        flaky = upstream.base_url("flaky")
        app, exported = traced_app(deployments=[upstream_deployment("flaky", [flaky, flaky])])
        body = {"model": "flaky", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
        answer = post(app, body, {"traceparent": TRACEPARENT})
        assert answer.status_code == 200, answer.text
        server, clients = spans_by_kind(exported)
        assert [c.status.status_code.name for c in clients] == ["ERROR", "UNSET"]
        assert dict(clients[0].attributes or {})["http.response.status_code"] in (500, 502)
        for client in clients:
            assert client.parent is not None and client.parent.span_id == server.context.span_id
            assert format(client.context.trace_id, "032x") == PARENT_TRACE
            attributes = dict(client.attributes or {})
            assert attributes["chatgate.deployment"] == "flaky"
            assert attributes["gen_ai.system"] == "openai"
        assert dict(clients[1].attributes or {})["gen_ai.usage.output_tokens"] == 2
        assert dict(server.attributes or {})["chatgate.retries"] == 1
        # each attempt carried its own span to the upstream, in the caller's trace
        sent = [header for _, header in upstream.traceparents]
        assert sent == [f"00-{PARENT_TRACE}-{format(c.context.span_id, '016x')}-01" for c in clients]


def test_a_failover_is_a_client_span_per_deployment():
    closed = f"http://127.0.0.1:{free_port()}/v1"
    with FaultUpstream() as upstream:
        app, exported = traced_app(
            deployments=[
                upstream_deployment("primary", [closed], fallback=["backup"]),
                upstream_deployment("backup", [upstream.base_url("ok")]),
            ]
        )
        answer = post(app, {"model": "primary", "messages": [{"role": "user", "content": "hi"}]})
        assert answer.status_code == 200, answer.text
        server, clients = spans_by_kind(exported)
        assert [dict(c.attributes or {})["chatgate.deployment"] for c in clients] == ["primary", "backup"]
        assert [c.status.status_code.name for c in clients] == ["ERROR", "UNSET"]
        assert all(c.parent is not None and c.parent.span_id == server.context.span_id for c in clients)
        assert dict(server.attributes or {})["chatgate.deployment"] == "backup"


def test_with_tracing_off_the_callers_traceparent_goes_upstream_as_it_came():
    with FaultUpstream() as upstream:
        app = create_app(
            Settings.model_validate({"deployments": [upstream_deployment("ok", [upstream.base_url("ok")])]})
        )
        body = {"model": "ok", "messages": [{"role": "user", "content": "hi"}]}

        async def send() -> httpx.Response:
            async with LifespanManager(app) as started:
                transport = httpx.ASGITransport(app=started.app)
                async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
                    return await client.post(
                        "/v1/chat/completions", json=body, headers={"traceparent": TRACEPARENT}
                    )

        assert asyncio.run(send()).status_code == 200
        assert upstream.traceparents == [("ok", TRACEPARENT)]


def test_sampling_follows_the_callers_flag_else_the_ratio():
    unsampled_parent = TRACEPARENT.removesuffix("-01") + "-00"
    body = {"model": "echo", "messages": [{"role": "user", "content": "hello"}]}
    app, exported = traced_app(tracing=TracingSettings(enabled=True, exporter="none", sample_ratio=0))
    assert post(app, body).status_code == 200  # no parent, ratio 0: not traced
    assert post(app, body, {"traceparent": unsampled_parent}).status_code == 200
    assert exported.get_finished_spans() == ()
    app, exported = traced_app(tracing=TracingSettings(enabled=True, exporter="none", sample_ratio=0))
    assert post(app, body, {"traceparent": TRACEPARENT}).status_code == 200  # the caller samples it
    kinds = sorted(span.kind.name for span in exported.get_finished_spans())
    assert kinds == ["CLIENT", "SERVER"]


def test_an_unsampled_request_sends_the_callers_traceparent_on_as_it_came():
    unsampled_parent = TRACEPARENT.removesuffix("-01") + "-00"
    with FaultUpstream() as upstream:
        app, exported = traced_app(deployments=[upstream_deployment("ok", [upstream.base_url("ok")])])
        body = {"model": "ok", "messages": [{"role": "user", "content": "hi"}]}
        assert post(app, body, {"traceparent": unsampled_parent}).status_code == 200
        assert upstream.traceparents == [("ok", unsampled_parent)]
        assert exported.get_finished_spans() == ()
