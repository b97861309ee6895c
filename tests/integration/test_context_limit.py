"""The context limit is checked only where one is declared (issue 27, finding 5): the
openai-compatible backend used to carry a placeholder of 1048576 tokens, and refused
`max_completion_tokens: 1048575` as "This model's context is 1048576 tokens" although the
upstream, which enforces its own, would have taken it. A deployment's `context_length` is
still a limit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from tests.support.deviating_upstream import running_deviating_upstream
from tests.support.gateway_process import gateway_process

HI = [{"role": "user", "content": "hi"}]


def relay(url: str, **capabilities: Any) -> dict[str, Any]:
    deployment = {"name": "dev", "backend": "openai-compatible", "options": {"base_url": url}}
    if capabilities:
        deployment["capabilities"] = capabilities
    return {"deployments": [deployment]}


def ask(gateway: str, **parameters: Any) -> httpx.Response:
    body = {"model": "dev", "messages": HI, **parameters}
    return httpx.post(f"{gateway}/v1/chat/completions", json=body, timeout=30)


def test_without_a_declared_limit_a_large_max_tokens_reaches_the_upstream(tmp_path: Path):
    with running_deviating_upstream() as upstream, gateway_process(tmp_path, relay(upstream.url)) as gateway:
        for parameters in ({"max_completion_tokens": 1048575}, {"max_tokens": 1048576}):
            answer = ask(gateway.url, **parameters)
            assert answer.status_code == 200, (parameters, answer.text)
            assert "context" not in answer.text
        assert [b.get("max_tokens", b.get("max_completion_tokens")) for b in upstream.bodies] == [
            1048575,
            1048576,
        ]


def test_a_declared_context_length_is_still_checked(tmp_path: Path):
    config = relay("http://127.0.0.1:9/v1", context_length=100)
    with gateway_process(tmp_path, config) as gateway:
        refused = ask(gateway.url, max_tokens=1000)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["code"] == "context_length_exceeded" and "100 tokens" in error["message"]
