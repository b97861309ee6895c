"""The access log: one JSON line per request on stdout, naming the key, never showing it (paths
nothing serves: tests/integration/test_unserved_paths.py)."""

from __future__ import annotations

from pathlib import Path

import httpx
import orjson
import pytest
import yaml

from gateway.policy.auth import new_key
from tests.support.servers import running_gateway

FIELDS = {
    "ts", "request_id", "method", "path", "route", "dialect", "deployment", "replica", "key", "status",
    "latency_ms", "ttft_ms", "stream", "prompt_tokens", "completion_tokens", "cost", "retries", "error",
    "upstream_request_id", "sent_request_id",
}  # fmt: skip
USER = [{"role": "user", "content": "a secret message"}]


def access_lines(log: Path) -> list[dict]:
    lines = []
    for line in log.read_text().splitlines():
        if line.startswith("{"):
            lines.append(orjson.loads(line))
    return lines


@pytest.fixture(scope="module")
def key_config(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    key, sha256 = new_key()
    config = tmp_path_factory.mktemp("access") / "config.yaml"
    config.write_text(yaml.safe_dump({"keys": [{"name": "team-a", "sha256": sha256}]}))
    return config, key


@pytest.mark.parametrize("stream", [False, True])
def test_each_chat_request_is_one_line(tmp_path: Path, key_config, stream: bool):
    config, key = key_config
    with running_gateway(tmp_path, config) as url:
        answered = httpx.post(
            f"{url}/v1/chat/completions",
            json={"model": "echo", "messages": USER, "stream": stream},
            headers={"authorization": f"Bearer {key}"},
        )
        refused = httpx.post(f"{url}/v1/chat/completions", json={"model": "echo", "messages": USER})
        httpx.get(f"{url}/health")
    assert answered.status_code == 200 and refused.status_code == 401
    log = next(tmp_path.glob("gateway-*.log"))
    text = log.read_text()
    assert key not in text and "a secret message" not in text
    lines = access_lines(log)
    assert len(lines) == 2  # the chat requests; /health is not logged
    first, second = lines
    assert set(first) == FIELDS
    assert first["request_id"] == answered.headers["x-request-id"]
    assert (first["status"], first["key"], first["dialect"]) == (200, "team-a", "openai")
    assert first["stream"] is stream
    assert first["deployment"] == "echo" and first["prompt_tokens"] > 0 and first["completion_tokens"] > 0
    assert first["latency_ms"] > 0 and first["ttft_ms"] is not None and first["error"] is None
    assert (second["status"], second["request_id"]) == (401, refused.headers["x-request-id"])


def test_no_access_log_writes_none(tmp_path: Path):
    with running_gateway(tmp_path, None, "--no-access-log") as url:
        response = httpx.post(f"{url}/v1/chat/completions", json={"model": "echo", "messages": USER})
    assert response.status_code == 200
    assert access_lines(next(tmp_path.glob("gateway-*.log"))) == []


def test_every_log_line_is_json_with_log_format_json(tmp_path: Path):
    """`--log-format json` (the image's default): start-up, requests, errors and the stop, every
    line on stdout and stderr is one JSON object."""
    import json
    import signal

    from tests.support.gateway_process import gateway_process

    with gateway_process(tmp_path, None, "--log-format", "json") as gateway:
        httpx.post(f"{gateway.url}/v1/chat/completions", json={"model": "echo", "messages": "bad"})
        httpx.post(
            f"{gateway.url}/v1/chat/completions",
            json={"model": "echo", "messages": [{"role": "user", "content": "hi"}]},
        )
        gateway.signal(signal.SIGTERM)
        assert gateway.wait(20) == 0
        lines = [line for line in gateway.output().splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]  # raises on any line that is not JSON
    assert any(r.get("level") == "info" and "serving on" in r.get("message", "") for r in records)
    assert sum(1 for r in records if "request_id" in r) == 2  # the two access lines
