"""Every token counted (issue 28): a client that hangs up just before a stream's usage is charged
what was relayed (and its prompt) in the budget, the metrics, the cost and the access log, with
the memory store and across two gateways on one Redis; a prompt larger than a token limit is
told so; `--workers N` never splits limits and budgets in memory; a key's hidden deployment is
a 404 naming the model the client asked for. Real `chatgate serve` processes throughout."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest
import redis
import yaml

from gateway.core.token_count import estimate
from gateway.policy.auth import new_key
from tests.support.fault_upstream import FaultUpstream
from tests.support.gateway_process import GatewayProcess, gateway_process
from tests.support.held_upstream import HeldUpstream
from tests.support.redis_server import running_redis
from tests.support.servers import ROOT, free_port

pytestmark = pytest.mark.slow  # out of the fast lane (docs/development/tests.md)

KEY, KEY_SHA = new_key()
AUTH = {"authorization": f"Bearer {KEY}"}
USER = [{"role": "user", "content": "tell me a long story, please"}]
PROMPT = estimate(USER)  # what admission counts for a deployment without a tokenizer
STREAMS = 20
RELAYED = 59  # the chunks each stream relays before it would have ended (and sent its usage)
PRICE = {"input": 2.0, "output": 10.0}  # per million tokens
CHARGED = STREAMS * (PROMPT + RELAYED)


@pytest.fixture(scope="module")
def upstream() -> Iterator[HeldUpstream]:
    with HeldUpstream() as server:
        yield server


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory) -> Iterator[str]:
    with running_redis(tmp_path_factory.mktemp("redis")) as (url, _process):
        yield url


def settings(upstream: HeldUpstream, redis_url: str | None) -> dict:
    config: dict = {
        "keys": [
            {"name": "reader", "sha256": KEY_SHA, "budgets": [{"tokens": CHARGED, "per": "day"}],
             "limits": {"tokens_per_minute": 10**7}},
        ],
        "deployments": [
            {"name": "held", "backend": "openai-compatible", "price": PRICE,
             "options": {"base_url": upstream.base_url(RELAYED)},
             "health": {"failures": 1000}, "timeouts": {"idle": 120, "total": 600}},
        ],
    }  # fmt: skip
    if redis_url is not None:
        config["rate_limits"] = {"store": "redis", "redis": {"url": redis_url}}
    return config


def read_all_but_the_end(url: str) -> None:
    """A stream read until its last relayed chunk, then closed: the client hangs up just before
    the usage would have come."""
    body = {"model": "held", "messages": USER, "stream": True}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, headers=AUTH, timeout=60) as response:
        assert response.status_code == 200, response.read()
        seen = 0
        for line in response.iter_lines():
            if line.startswith("data: ") and '"content":" w' in line:
                seen += 1
                if seen == RELAYED:
                    break
        assert seen == RELAYED


def wait_until(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def budget_spent(url: str) -> float | None:
    """What the key has spent and holds, as the budget's refusal says; None when admitted (the
    admitted request is itself a held stream, read to its end and closed)."""
    body = {"model": "held", "messages": USER, "stream": True}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, headers=AUTH, timeout=60) as response:
        if response.status_code == 200:
            return None
        text = response.read().decode()
    assert response.status_code == 429 and "budget" in text, text
    found = re.search(r"\(([\d,.]+) spent\)", text)
    assert found is not None, text
    return float(found.group(1).replace(",", ""))


def metric(url: str, line_start: str) -> float:
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith(line_start):
            return float(line.rpartition(" ")[2])
    return 0.0


def access_lines(gateway: GatewayProcess) -> list[dict]:
    return [orjson.loads(line) for line in gateway.output().splitlines() if line.startswith('{"ts"')]


def check_charged(gateways: list[GatewayProcess], upstream: HeldUpstream) -> None:
    """The hang-ups' charges, seen from the last gateway (budget) and every one (metrics, log)."""
    assert wait_until(lambda: upstream.answering[f"held-{RELAYED}"] == 0, 30), "hang-ups not heard"
    spent = None
    deadline = time.monotonic() + 30
    while spent != CHARGED and time.monotonic() < deadline:  # settled just after each hang-up
        spent = budget_spent(gateways[-1].url)
        time.sleep(0.2)
    assert spent == CHARGED, f"{spent} spent; {CHARGED} relayed and prompted"
    tokens, cost = "chatgate_usage_tokens_total{", "chatgate_usage_cost_total{"
    where = 'deployment="held",key="reader"'
    inputs = sum(metric(g.url, f'{tokens}{where},type="input"}}') for g in gateways)
    outputs = sum(metric(g.url, f'{tokens}{where},type="output"}}') for g in gateways)
    costs = sum(metric(g.url, f"{cost}{where}}}") for g in gateways)
    assert (inputs, outputs) == (STREAMS * PROMPT, STREAMS * RELAYED)
    assert costs == pytest.approx(STREAMS * (PROMPT * PRICE["input"] + RELAYED * PRICE["output"]) / 1e6)
    hung_up = [line for g in gateways for line in access_lines(g) if line["status"] == 200]
    assert len(hung_up) == STREAMS
    for line in hung_up:
        assert (line["prompt_tokens"], line["completion_tokens"]) == (PROMPT, RELAYED), line
        assert line["cost"] == pytest.approx((PROMPT * PRICE["input"] + RELAYED * PRICE["output"]) / 1e6)


def test_a_client_that_hangs_up_before_the_usage_is_charged_what_was_relayed(tmp_path, upstream):
    """Regression (issue 28, item 1): 20 streams read to 59 of their chunks and closed were
    charged nothing: 0 in the budget, the metrics and the access log."""
    with gateway_process(tmp_path, settings(upstream, None)) as gateway:
        for _ in range(STREAMS):
            read_all_but_the_end(gateway.url)
        check_charged([gateway], upstream)


def test_hang_ups_are_charged_in_a_shared_redis_seen_by_another_gateway(tmp_path, upstream, redis_url):
    """The same with two gateways on one Redis: the streams' gateway charges the store, the
    other one refuses on what they used."""
    redis.Redis.from_url(redis_url).flushall()
    config = settings(upstream, redis_url)
    with gateway_process(tmp_path, config) as streamed, gateway_process(tmp_path, config) as other:
        for _ in range(STREAMS):
            read_all_but_the_end(streamed.url)
        check_charged([streamed, other], upstream)


def test_a_prompt_larger_than_the_token_limit_is_told_so_not_to_retry(tmp_path):
    """Regression (issue 28, item 3): a prompt that can never fit the key's tokens per minute got
    "Rate limit reached for requests; retry after 1 seconds", forever, counted as requests."""
    limit = 50
    config = {
        "keys": [{"name": "small", "sha256": KEY_SHA, "limits": {"tokens_per_minute": limit}}],
        "deployments": [{"name": "echo", "backend": "echo", "models": ["*"]}],
    }
    big = [{"role": "user", "content": "word " * 400}]
    requested = estimate(big)
    assert requested > limit
    with gateway_process(tmp_path, config) as gateway:
        url = f"{gateway.url}/v1/chat/completions"
        answers = [httpx.post(url, json={"model": "echo", "messages": big}, headers=AUTH) for _ in range(2)]
        small = httpx.post(url, json={"model": "echo", "messages": USER, "max_tokens": 2}, headers=AUTH)
        metrics = httpx.get(f"{gateway.url}/metrics").text
    for answer in answers:
        assert answer.status_code == 429
        error = answer.json()["error"]
        assert error["message"].startswith("Request too large for key 'small' on tokens per min"), error
        assert f"Limit {limit}, Requested {requested}" in error["message"]
        assert "retry-after" not in answer.headers
    assert small.status_code == 200  # nothing was taken from the limit by the refusals
    assert 'chatgate_rate_limited_total{kind="tokens"} 2.0' in metrics
    assert 'chatgate_rate_limited_total{kind="requests"}' not in metrics


def serve_with_workers(tmp_path: Path, config: dict, workers: int = 2) -> subprocess.Popen:
    path = tmp_path / f"workers-{len(list(tmp_path.glob('workers-*.yaml')))}.yaml"
    path.write_text(yaml.safe_dump(config))
    command = [sys.executable, "-m", "gateway", "serve", "--port", str(free_port()), "--config", str(path)]
    return subprocess.Popen(
        [*command, "--workers", str(workers)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )


def test_workers_with_the_memory_store_refuse_to_start_with_budgets_or_limits(tmp_path):
    """Regression (issue 28, item 5): `--workers 2` with the memory store kept a count per
    worker, so a 60-token daily budget let 140 tokens through. It now refuses to start, in one
    line naming the fix."""
    budgets = {"name": "team", "sha256": KEY_SHA, "budgets": [{"tokens": 60, "per": "day"}]}
    deployment_limits = {"name": "echo", "backend": "echo", "limits": {"requests_per_minute": 5}}
    for config in ({"keys": [budgets]}, {"deployments": [deployment_limits]}):
        process = serve_with_workers(tmp_path, config)
        try:
            output, _ = process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            pytest.fail("the gateway started with per-worker limits and budgets")
        text = output.decode()
        assert process.returncode != 0
        assert "rate_limits.store: redis" in text and "--workers 2" in text, text
        assert "Traceback" not in text


def test_workers_with_the_memory_store_start_without_limits_or_budgets(tmp_path):
    """Nothing to split: a gateway with keys but no limits or budgets starts with --workers 2."""
    with gateway_process(tmp_path, {"keys": [{"name": "team", "sha256": KEY_SHA}]}, "--workers", "2") as g:
        answer = httpx.post(
            f"{g.url}/v1/chat/completions", json={"model": "echo", "messages": USER}, headers=AUTH
        )
    assert answer.status_code == 200


def test_a_hidden_deployment_is_a_404_naming_the_model_asked_for(tmp_path):
    """Regression (issue 28, item 7): the 404 for a key not allowed on a deployment named the
    deployment, which the client never asked for (and should not learn)."""
    config = {
        "keys": [{"name": "team", "sha256": KEY_SHA, "deployments": ["public"]}],
        "deployments": [
            {"name": "public", "backend": "echo"},
            {"name": "internal-gpu-pool", "backend": "echo", "models": ["gpt-secret"]},
        ],
    }
    with gateway_process(tmp_path, config) as gateway:
        answer = httpx.post(
            f"{gateway.url}/v1/chat/completions", json={"model": "gpt-secret", "messages": USER}, headers=AUTH
        )
    assert answer.status_code == 404
    assert "gpt-secret" in answer.text and "internal-gpu-pool" not in answer.text, answer.text


def test_a_reload_that_would_split_limits_between_workers_is_refused(tmp_path):
    """What the start refuses, a reload refuses too: budgets added to the config of a
    `--workers 2` gateway on the memory store are not applied (each worker would count them
    alone); the running config stays, and every worker says why."""
    key = {"name": "team", "sha256": KEY_SHA}
    with gateway_process(tmp_path, {"keys": [key]}, "--workers", "2") as gateway:
        config = next(tmp_path.glob("chatgate-*.yaml"))
        config.write_text(yaml.safe_dump({"keys": [{**key, "budgets": [{"tokens": 1, "per": "day"}]}]}))
        refusal = "refused, the running config stays"
        assert wait_until(lambda: gateway.output().count(refusal) >= 2, 30), gateway.output()
        answers = [
            httpx.post(
                f"{gateway.url}/v1/chat/completions", json={"model": "echo", "messages": USER}, headers=AUTH
            )
            for _ in range(4)
        ]
    assert [a.status_code for a in answers] == [200] * 4
    assert "rate_limits.store: redis" in gateway.output()


def test_a_stream_the_upstream_cuts_is_charged_what_was_relayed(tmp_path):
    """An upstream that drops the connection after its first chunk ("fine"): the stream ends
    with an error event, and the prompt and that word are charged (before, nothing was)."""
    with FaultUpstream() as upstream:
        config = {
            "keys": [{"name": "reader", "sha256": KEY_SHA, "budgets": [{"tokens": 10**6, "per": "day"}]}],
            "deployments": [
                {"name": "cut", "backend": "openai-compatible", "price": PRICE,
                 "options": {"base_url": upstream.base_url("reset")}, "health": {"failures": 1000}},
            ],
        }  # fmt: skip
        with gateway_process(tmp_path, config) as gateway:
            body = {"model": "cut", "messages": USER, "stream": True}
            answer = httpx.post(f"{gateway.url}/v1/chat/completions", json=body, headers=AUTH, timeout=60)
            output = metric(
                gateway.url, 'chatgate_usage_tokens_total{deployment="cut",key="reader",type="output"}'
            )
            lines = access_lines(gateway)
    assert answer.status_code == 200 and '"fine"' in answer.text and "error" in answer.text
    assert output == 1
    assert [(line["prompt_tokens"], line["completion_tokens"]) for line in lines] == [(PROMPT, 1)]
