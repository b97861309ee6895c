"""A fan-out (`options.n: fan-out`) makes n upstream requests of one choice, each reading the
prompt: admission counts the prompt once a choice against token limits and hard budgets (the
answer is charged that much), and each upstream request takes a slot of `max_concurrent`, with
no more choices than a replica has slots. Real gateway processes in front of a stand-in that
counts its requests in flight and reports the prompt as the gateway estimates it."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml

from gateway.core.token_count import estimate
from gateway.policy.auth import new_key
from tests.support.loopback_server import LoopbackServer, read_request
from tests.support.servers import running_gateway

PROMPT = "x" * 3996  # estimated by the gateway, and reported by the stand-in, as 1,002 tokens
MESSAGES = [{"role": "user", "content": PROMPT}]
PROMPT_TOKENS = estimate(MESSAGES)
BUDGET = 5_000


class CountingUpstream(LoopbackServer):
    """Answers each request after `delay` seconds with one choice of two tokens; the prompt's
    usage as the gateway estimates it; counts the requests in flight (and the most at once)."""

    thread_name = "counting-upstream"

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay
        self.in_flight = 0
        self.most_in_flight = 0
        self.received = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        try:
            _method, _target, _headers, raw = await read_request(reader)
            body = orjson.loads(raw)
            self.received += 1
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            try:
                await asyncio.sleep(self.delay)
            finally:
                self.in_flight -= 1
            usage = {"prompt_tokens": estimate(body["messages"]), "completion_tokens": 2}
            usage["total_tokens"] = usage["prompt_tokens"] + 2
            choice = {"index": 0, "message": {"role": "assistant", "content": "a b"}, "finish_reason": "stop"}
            completion = {"id": "up", "object": "chat.completion", "created": 0, "model": "up"}
            answer = orjson.dumps({**completion, "usage": usage, "choices": [choice]})
            head = f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {len(answer)}\r\n"
            writer.write((head + "connection: close\r\n\r\n").encode() + answer)
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            self.tasks.discard(task)


def fan_out(upstream: CountingUpstream, **deployment: Any) -> dict[str, Any]:
    return {
        "name": "fan",
        "backend": "openai-compatible",
        "options": {"base_url": f"{upstream.url}/v1", "n": "fan-out", "first_byte": 20, "total": 30},
        "capabilities": {"default_max_tokens": 5},
        **deployment,
    }


@contextmanager
def gateway_with(tmp_path: Path, log_dir: Path, config: dict[str, Any]) -> Iterator[str]:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    with running_gateway(log_dir, path) as url:
        yield url


def ask(url: str, key: str | None, n: int) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = {"model": "fan", "n": n, "messages": MESSAGES}
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=60)


def spent_or_held(refusal: httpx.Response) -> float:
    found = re.search(r"\(([\d,.]+) spent or held\)", refusal.json()["error"]["message"])
    assert found, refusal.text
    return float(found.group(1).replace(",", ""))


@pytest.fixture
def slow_upstream() -> Iterator[CountingUpstream]:
    with CountingUpstream(delay=1.0) as upstream:
        yield upstream


@pytest.fixture
def quick_upstream() -> Iterator[CountingUpstream]:
    with CountingUpstream(delay=0.0) as upstream:
        yield upstream


def test_a_hard_budget_holds_a_fan_outs_prompts(tmp_path: Path, log_dir: Path, quick_upstream) -> None:
    """n=8 of a 1,002-token prompt reads 8,016 prompt tokens: refused before any upstream request
    against a 5,000-token hard budget; four at once of n=4 (4,028 each) let one through; the
    account never holds more than the budget."""
    key, sha = new_key()
    config = {
        "keys": [{"name": "h", "sha256": sha, "budgets": [{"tokens": BUDGET, "per": "day", "hard": True}]}],
        "deployments": [fan_out(quick_upstream)],
    }
    with gateway_with(tmp_path, log_dir, config) as url:
        refused = ask(url, key, 8)
        assert refused.status_code == 429, refused.text
        assert quick_upstream.received == 0
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda _: ask(url, key, 4), range(4)))
        assert sorted(a.status_code for a in answers) == [200, 429, 429, 429]
        (served,) = [a for a in answers if a.status_code == 200]
        assert served.json()["usage"]["prompt_tokens"] == 4 * PROMPT_TOKENS
        after = ask(url, key, 1)
        assert after.status_code == 429
        assert spent_or_held(after) <= BUDGET
        assert quick_upstream.received == 4


def test_a_token_limit_counts_a_fan_outs_prompts(tmp_path: Path, log_dir: Path, quick_upstream) -> None:
    key, sha = new_key()
    config = {
        "keys": [{"name": "t", "sha256": sha, "limits": {"tokens_per_minute": 3_000}}],
        "deployments": [fan_out(quick_upstream)],
    }
    with gateway_with(tmp_path, log_dir, config) as url:
        too_large = ask(url, key, 4)  # 4,008 prompt tokens against 3,000 a minute
        assert too_large.status_code == 429
        assert "Requested 4008" in too_large.json()["error"]["message"]
        assert quick_upstream.received == 0
        assert ask(url, key, 2).status_code == 200


def test_each_upstream_request_of_a_fan_out_takes_a_slot(
    tmp_path: Path, log_dir: Path, slow_upstream: CountingUpstream
) -> None:
    """max_concurrent 4: five requests of n=4 at once reach the upstream four at a time, never
    more; a request for more choices than the slots is a 422 naming n."""
    deployment = fan_out(slow_upstream, concurrency={"max_concurrent": 4, "queue": 8, "queue_timeout": 30})
    with gateway_with(tmp_path, log_dir, {"deployments": [deployment]}) as url:
        too_many = ask(url, None, 5)
        assert too_many.status_code == 422
        assert too_many.json()["error"]["param"] == "n"
        with ThreadPoolExecutor(5) as pool:
            answers = list(pool.map(lambda _: ask(url, None, 4), range(5)))
        assert [a.status_code for a in answers] == [200] * 5
        assert all(len(a.json()["choices"]) == 4 for a in answers)
        assert slow_upstream.received == 20
        assert slow_upstream.most_in_flight == 4


def test_a_fan_out_without_a_bound_takes_at_most_sixteen_choices(
    tmp_path: Path, log_dir: Path, quick_upstream
) -> None:
    with gateway_with(tmp_path, log_dir, {"deployments": [fan_out(quick_upstream)]}) as url:
        refused = ask(url, None, 17)
        assert refused.status_code == 422
        assert refused.json()["error"]["param"] == "n"
        assert quick_upstream.received == 0
        assert len(ask(url, None, 16).json()["choices"]) == 16
