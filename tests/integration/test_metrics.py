"""/metrics counts exactly what was sent, by dialect, deployment and status — also when the
gateway runs several worker processes."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.support.servers import running_gateway

CONFIG = """
deployments:
  - name: counted
    backend: echo
  - name: other
    backend: echo
"""
AZURE = "/azure/chat/completions?api-version=2024-05-01-preview"
# (path, body, expected status)
MIX = (
    [("/v1/chat/completions", {"model": "counted", "messages": [{"role": "user", "content": "a"}]}, 200)] * 7
    + [("/v1/chat/completions", {"model": "counted", "messages": [{"role": "user", "content": "a"}],
                                  "stream": True}, 200)] * 3
    + [(AZURE, {"model": "other", "messages": [{"role": "user", "content": "b"}]}, 200)] * 4
    + [("/v1/chat/completions", {"model": "nope", "messages": [{"role": "user", "content": "a"}]}, 404)] * 2
    + [("/v1/chat/completions", {"model": "counted", "messages": "not a list"}, 400)] * 5
    + [("/v1/chat/completions", {"model": "counted", "messages": [{"role": "user", "content": "a"}],
                                  "surprise": 1}, 400)] * 3
)  # fmt: skip
CHAT = "/v1/chat/completions"


def series(deployment: str, dialect: str, key: str, route: str, status: int) -> str:
    labels = f'deployment="{deployment}",dialect="{dialect}",key="{key}",route="{route}",status="{status}"'
    return f"chatgate_requests_total{{{labels}}}"


EXPECTED = {
    series("counted", "openai", "anonymous", CHAT, 200): 10,
    series("other", "azure", "anonymous", "/azure/chat/completions", 200): 4,
    series("none", "openai", "anonymous", CHAT, 404): 2,
    series("none", "openai", "none", CHAT, 400): 5,
    series("counted", "openai", "anonymous", CHAT, 400): 3,
}


def scrape(url: str) -> dict[str, float]:
    values = {}
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith("chatgate_requests_total{") or line.startswith("chatgate_usage_tokens_total"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


@pytest.mark.parametrize("workers", [1, 2])
def test_counters_match_what_was_sent(tmp_path, log_dir, workers):
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG)
    with running_gateway(log_dir, config, "--workers", str(workers)) as url:

        def send(item):
            path, body, status = item
            response = httpx.post(f"{url}{path}", json=body, timeout=30)
            assert response.status_code == status, response.text
            return response

        with ThreadPoolExecutor(6) as pool:
            responses = list(pool.map(send, MIX))
        assert len(responses) == len(MIX)
        values = scrape(url)
        counted = {k: v for k, v in values.items() if k.startswith("chatgate_requests_total")}
        assert counted == EXPECTED
        # the ten `counted` answers (seven whole, three streamed) are the same echo
        usage = responses[0].json()["usage"]
        output = values['chatgate_usage_tokens_total{deployment="counted",key="anonymous",type="output"}']
        assert output == 10 * usage["completion_tokens"]
        assert values['chatgate_usage_tokens_total{deployment="counted",key="anonymous",type="input"}'] == (
            10 * usage["prompt_tokens"]
        )


def test_a_stream_that_fails_is_recorded_as_failed(tmp_path, log_dir):
    """Its status stays the 200 that went out, but the access log's `error` and the metrics'
    error counter name how it ended."""
    import orjson

    from tests.support.fault_upstream import FaultUpstream

    with FaultUpstream() as upstream:
        config = tmp_path / "config.yaml"
        config.write_text(
            "deployments:\n"
            "  - {name: up, backend: openai-compatible, timeouts: {idle: 0.5},\n"
            f"     options: {{base_url: '{upstream.base_url('stall-mid')}'}}}}\n"
        )
        with running_gateway(log_dir, config) as url:
            body = {"model": "up", "messages": [{"role": "user", "content": "a"}], "stream": True}
            with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=10) as response:
                assert response.status_code == 200
                lines = [line for line in response.iter_lines() if line]
            metrics = httpx.get(f"{url}/metrics").text
    assert "UpstreamTimeout" in lines[-1]
    counted = 'chatgate_request_errors_total{code="UpstreamTimeout",deployment="up",dialect="openai"} 1.0'
    assert counted in metrics
    log = max(log_dir.glob("gateway-*.log"), key=lambda p: p.stat().st_mtime).read_text()
    records = [orjson.loads(line) for line in log.splitlines() if line.startswith('{"ts"')]
    assert records[-1]["status"] == 200 and records[-1]["error"] == "UpstreamTimeout"


def test_the_plain_numbers_show_what_prometheus_clients_metrics_show():
    """One process keeps plain numbers and renders them when scraped; several keep
    prometheus_client's metrics. The same requests read the same in both (the histograms'
    `_created` aside, which the plain numbers do not keep)."""
    from prometheus_client import generate_latest

    from gateway.telemetry.metrics import PlainNumbers, SharedFiles
    from gateway.telemetry.record import RequestRecord

    class Replica:
        name, healthy = "r0", False

    def record(status: int, deployment: str | None, **fields) -> RequestRecord:
        found = RequestRecord("id", "POST", "/v1/chat/completions", dialect="openai", route="/v1/c")
        found.status, found.deployment = status, deployment
        for name, value in fields.items():
            setattr(found, name, value)
        return found

    plain, shared = PlainNumbers(), SharedFiles()
    for metrics in (plain, shared):
        for seconds in (0.0005, 0.003, 0.003, 0.2, 7.0, 500.0):
            metrics.started()
            metrics.finished(record(200, "a", prompt_tokens=3, completion_tokens=9, cost=0.25), seconds)
        metrics.started()
        metrics.finished(record(429, "a", key="k", error_code="RateLimited", rate_limited="tokens"), 0.001)
        metrics.started()  # still in flight
        metrics.retry("a")
        metrics.panic("a")
        metrics.waiting("a", +1)
        metrics.replica_health("a", Replica())
        metrics.log_line_dropped()

    def samples(text: bytes) -> list[str]:
        return sorted(
            line
            for line in text.decode().splitlines()
            if line.startswith(("chatgate_", "gen_ai_")) and "_created" not in line
        )

    shown = samples(plain.exposition())
    assert shown == samples(generate_latest(shared.registry))
    assert f"{series('a', 'openai', 'none', '/v1/c', 200)} 6.0" in shown
    assert 'chatgate_request_duration_seconds_bucket{deployment="a",dialect="openai",le="0.005"} 4.0' in shown
    assert "chatgate_requests_in_flight 1.0" in shown
