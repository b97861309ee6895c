"""Image hosts whose DNS never answers stall only the requests that name them: their lookups run
on threads of their own with a deadline, and the upstreams' lookups on others. A real gateway
whose name lookups stall for names under `slow.test` (tests/support/stalled_dns), with remote
images fetched, in front of an upstream named by a hostname."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.support.choices_upstream import ChoicesUpstream
from tests.support.gateway_process import gateway_process

STALLED_DNS = Path(__file__).parents[1] / "support" / "stalled_dns"


def naming_stalled_hosts(url: str, request: int) -> httpx.Response:
    content = [{"type": "text", "text": "What are they?"}]
    urls = [f"http://h{request}-{i}.slow.test/img.png" for i in range(3)]
    content += [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    body = {"model": "echo", "messages": [{"role": "user", "content": content}]}
    return httpx.post(f"{url}/v3/chat/completions", json=body, timeout=60)


def test_image_hosts_that_never_resolve_stall_no_other_deployment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(STALLED_DNS))
    with ChoicesUpstream() as upstream:
        port = upstream.url.rsplit(":", 1)[1]
        config = {
            "media": {"remote_images": "fetch", "allowed_private_networks": ["127.0.0.1/32"]},
            "deployments": [
                {"name": "echo", "backend": "echo"},
                {
                    "name": "up",
                    "backend": "openai-compatible",
                    "options": {"base_url": f"http://up.test:{port}/honours/v1", "connect": 5},
                    "retries": {"attempts": 1},
                },
            ],
        }
        with gateway_process(tmp_path, config) as gateway, ThreadPoolExecutor(12) as pool:
            attack = [pool.submit(naming_stalled_hosts, gateway.url, k) for k in range(12)]
            time.sleep(1.0)  # every stalled lookup has begun
            started = time.monotonic()
            body = {"model": "up", "messages": [{"role": "user", "content": "hi"}]}
            answer = httpx.post(f"{gateway.url}/v1/chat/completions", json=body, timeout=60)
            assert answer.status_code == 200, answer.text
            assert time.monotonic() - started < 3.0
            refused = [future.result() for future in attack]
        # the requests that named them fail alone, refused within the lookups' deadline
        assert {response.status_code for response in refused} == {403}
        assert "cannot be resolved" in refused[0].json()["error"]
