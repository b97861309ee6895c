"""No key — valid or not — appears in any log line, error body or header of a whole run."""

from __future__ import annotations

import httpx
import yaml

from gateway.policy.auth import new_key
from tests.support.servers import free_port, running_gateway

VALID, VALID_SHA = new_key()
WRONG = "cg-wrong-" + "z" * 30


def test_keys_stay_out_of_logs_and_answers(tmp_path, log_dir):
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "keys": [{"name": "logged-run", "sha256": VALID_SHA, "limits": {"requests_per_minute": 3}}],
                "content_filter": {"input": {"words": ["blocked"]}},
            }
        )
    )
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    seen: list[str] = []
    with running_gateway(log_dir, config, "--log-level", "debug") as url:
        chat = {"model": "echo", "messages": [{"role": "user", "content": "hello"}]}
        attempts = [
            ("/v1/chat/completions", {"authorization": f"Bearer {VALID}"}, chat),
            ("/v1/chat/completions", {"authorization": f"Bearer {WRONG}"}, chat),
            ("/v1/chat/completions", {"authorization": WRONG}, chat),
            ("/azure/chat/completions?api-version=2024-05-01-preview", {"api-key": WRONG}, chat),
            ("/azure/chat/completions?api-version=2024-05-01-preview",
             {"api-key": VALID, "authorization": f"Bearer {WRONG}"}, chat),
            ("/v1/chat/completions", {"authorization": f"Bearer {VALID}"}, {"messages": "bad"}),
            ("/v1/chat/completions", {"authorization": f"Bearer {VALID}"},
             {"model": "echo", "messages": [{"role": "user", "content": "blocked"}]}),
            ("/v1/chat/completions", {"authorization": f"Bearer {VALID}"}, chat),
            ("/v1/chat/completions", {"authorization": f"Bearer {VALID}"}, chat),
        ]  # fmt: skip
        statuses = []
        for path, headers, body in attempts:
            response = httpx.post(f"{url}{path}", headers=headers, json=body, timeout=30)
            statuses.append(response.status_code)
            seen.append(response.text)
            seen.extend(f"{k}: {v}" for k, v in response.headers.items())
    assert 200 in statuses and 401 in statuses and 429 in statuses and 400 in statuses
    logs = "".join(p.read_text() for p in log_dir.iterdir())
    assert logs, "the gateway wrote no log at all"
    for secret in (VALID, WRONG):
        assert secret not in logs
        assert not any(secret in line for line in seen)


def test_credentials_in_an_upstream_url_stay_out_of_logs(tmp_path):
    """`base_url` may carry `user:password@`; the logs name the upstream without them."""
    config = tmp_path / "config.yaml"
    nowhere = f"http://admin:hunter2@127.0.0.1:{free_port()}/v1"  # nothing listens: errors get logged
    deployment = {"name": "up", "backend": "openai-compatible", "options": {"base_url": nowhere}}
    config.write_text(yaml.safe_dump({"deployments": [deployment]}))
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    with running_gateway(log_dir, config, "--log-level", "debug") as url:
        chat = {"model": "up", "messages": [{"role": "user", "content": "hello"}]}
        answers = [httpx.post(f"{url}/v1/chat/completions", json=chat, timeout=30) for _ in range(2)]
    assert {a.status_code for a in answers} == {503}
    logs = "".join(p.read_text() for p in log_dir.iterdir())
    assert "127.0.0.1" in logs  # the upstream is named
    assert "hunter2" not in logs and "admin:" not in logs
    assert not any("hunter2" in a.text for a in answers)
