"""/metrics counts exactly what was sent, by dialect, deployment and status — also when the
gateway runs several worker processes."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.servers import running_gateway

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
EXPECTED = {
    'chatgate_requests_total{deployment="counted",dialect="openai",key="anonymous",status="200"}': 10,
    'chatgate_requests_total{deployment="other",dialect="azure",key="anonymous",status="200"}': 4,
    'chatgate_requests_total{deployment="none",dialect="openai",key="anonymous",status="404"}': 2,
    'chatgate_requests_total{deployment="none",dialect="openai",key="none",status="400"}': 5,
    'chatgate_requests_total{deployment="counted",dialect="openai",key="anonymous",status="400"}': 3,
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

    from tests.fault_upstream import FaultUpstream

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
