"""Budgets per key — tokens or cost per day, week or month — held in the rate-limit store: exact
across two gateway processes sharing a real Redis, refused with 429 in every dialect's shape
saying which budget and when it resets; usage and cost per key in the metrics."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
import yaml

from gateway.config.settings import Budget
from gateway.policy.auth import new_key
from gateway.policy.budgets import period_bounds
from tests.support.dialect_routes import main_routes
from tests.support.documents import documented_headers, response_errors
from tests.support.redis_server import running_redis
from tests.support.servers import running_gateway

KEY, KEY_SHA = new_key()
OTHER, OTHER_SHA = new_key()


@pytest.mark.parametrize(
    ("per", "now", "starts", "resets"),
    [
        ("day", "2026-11-23T15:00:00", "2026-11-23T00:00:00", "2026-11-24T00:00:00"),
        ("week", "2026-11-26T15:00:00", "2026-11-23T00:00:00", "2026-11-30T00:00:00"),  # Monday to Monday
        ("month", "2026-12-31T23:59:59", "2026-12-01T00:00:00", "2027-01-01T00:00:00"),
    ],
)
def test_periods_are_calendar_periods_in_utc(per, now, starts, resets):
    found = period_bounds(per, datetime.fromisoformat(now).replace(tzinfo=UTC))
    assert [t.isoformat() for t in found] == [f"{starts}+00:00", f"{resets}+00:00"]


def test_a_budget_is_tokens_or_cost():
    assert Budget(tokens=10, per="day").measure == "tokens"
    with pytest.raises(ValueError, match="tokens or cost"):
        Budget(tokens=10, cost=1.0, per="day")


def config(path: Path, redis_url: str | None, budgets: list[dict]) -> Path:
    settings: dict = {
        "keys": [
            {"name": "team-a", "sha256": KEY_SHA, "budgets": budgets},
            {"name": "team-b", "sha256": OTHER_SHA},
        ],
        "deployments": [
            {"name": "echo", "backend": "echo", "models": ["*"], "price": {"input": 2.0, "output": 10.0}}
        ],
    }
    if redis_url:
        settings["rate_limits"] = {"store": "redis", "redis": {"url": redis_url}}
    path.write_text(yaml.safe_dump(settings))
    return path


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory) -> Iterator[str]:
    with running_redis(tmp_path_factory.mktemp("redis")) as (url, _process):
        yield url


def chat(url: str, route_url: str, key: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}{route_url}", json=body, headers={"authorization": f"Bearer {key}"}, timeout=30)


def test_a_token_budget_holds_exactly_across_two_gateways(tmp_path: Path, log_dir: Path, redis_url: str):
    """Each answer uses a known number of tokens; the budget admits requests until what they used
    would pass it, counted once for both processes."""
    route = main_routes()["openai"]
    body = route.body("one two three", max_tokens=4)
    # measure one answer's tokens with a key that has no budget
    path = config(tmp_path / "a.yaml", redis_url, [{"tokens": 10**9, "per": "day"}])
    with running_gateway(log_dir, path) as probe:
        used = chat(probe, route.url, OTHER, body).json()["usage"]["total_tokens"]
    budget = used * 5 + used // 2  # room for five answers, not six
    path = config(tmp_path / "b.yaml", redis_url, [{"tokens": budget, "per": "week"}])
    with running_gateway(log_dir, path) as first, running_gateway(log_dir, path) as second:

        async def burst() -> list[httpx.Response]:
            async with httpx.AsyncClient(timeout=30) as client:
                results = []
                for index in range(8):  # one at a time, alternating gateways: each sees the last
                    target = (first, second)[index % 2]
                    results.append(
                        await client.post(
                            f"{target}{route.url}", json=body, headers={"authorization": f"Bearer {KEY}"}
                        )
                    )
                return results

        responses = asyncio.run(burst())
        statuses = [r.status_code for r in responses]
        assert statuses[:5] == [200] * 5, statuses
        assert set(statuses[5:]) == {429}, statuses
        refused = responses[-1]
        assert "budget of key 'team-a' for a week" in refused.json()["error"]["message"]
        assert refused.headers["x-budget-reset"].endswith("T00:00:00Z")
        assert int(refused.headers["retry-after"]) > 0
        # other keys are not touched by team-a's budget
        assert chat(first, route.url, OTHER, body).status_code == 200
        metrics = httpx.get(f"{first}/metrics").text + httpx.get(f"{second}/metrics").text
    input_tokens = sum(
        float(line.split()[1])
        for line in metrics.splitlines()
        if line.startswith('chatgate_usage_tokens_total{deployment="echo",key="team-a"')
    )
    assert input_tokens == 5 * used
    assert 'chatgate_usage_cost_total{deployment="echo",key="team-a"}' in metrics


@pytest.mark.parametrize("dialect", list(main_routes()))
def test_a_cost_budget_refuses_in_every_dialects_shape(tmp_path: Path, log_dir: Path, dialect: str):
    """One answer costs more than the budget: the next request is refused (memory store)."""
    route = main_routes()[dialect]
    path = config(tmp_path / "c.yaml", None, [{"cost": 0.00005, "per": "month"}])
    with running_gateway(log_dir, path) as url:
        assert chat(url, route.url, KEY, route.body("spend")).status_code == 200
        refused = chat(url, route.url, KEY, route.body("spend"))
    assert refused.status_code == 429
    assert response_errors(route.document, route.doc_path, "post", 429, refused.json()) == []
    assert "budget" in refused.text and "month" in refused.text
    # the refusal's headers are the document's (issue 28: x-budget-reset was in none)
    declared = documented_headers(route.document, route.doc_path, "post", 429)
    assert declared["x-budget-reset"] == {"type": "string", "format": "date-time"}
    assert {"retry-after", "x-budget-reset"} <= declared.keys()
    assert datetime.fromisoformat(refused.headers["x-budget-reset"]).day == 1  # the next month's start


def test_a_failed_request_gives_its_reservation_back(tmp_path: Path, log_dir: Path):
    """Admission reserves the prompt; an answer that fails (no usage) hands it back."""
    from tests.support.servers import free_port

    route = main_routes()["openai"]
    settings = {
        "keys": [{"name": "team-a", "sha256": KEY_SHA, "budgets": [{"tokens": 40, "per": "day"}]}],
        "deployments": [
            {"name": "echo", "backend": "echo"},
            {
                "name": "down",
                "backend": "openai-compatible",
                "retries": {"attempts": 1},
                "options": {"base_url": f"http://127.0.0.1:{free_port()}/v1"},
            },
        ],
    }
    path = tmp_path / "d.yaml"
    path.write_text(yaml.safe_dump(settings))
    prompt = "word " * 20  # about 28 tokens reserved each time: two reservations would not fit
    with running_gateway(log_dir, path) as url:
        failed = [chat(url, route.url, KEY, route.body(prompt, model="down")).status_code for _ in range(4)]
        answered = chat(url, route.url, KEY, route.body("short", model="echo"))
    assert failed == [503] * 4
    assert answered.status_code == 200, answered.text


def test_a_request_refused_after_admission_gives_its_reservation_back(tmp_path: Path, log_dir: Path):
    """An OVMS image is screened after admission: its refusal (here a remote image, refused by
    default) hands the reservation back, in the memory store too, where nothing else would."""
    route = main_routes()["ovms"]
    settings = {
        "keys": [{"name": "team-a", "sha256": KEY_SHA, "budgets": [{"tokens": 40, "per": "day"}]}],
        "deployments": [
            {"name": "echo", "backend": "echo", "capabilities": {"modalities": ["text", "image"]}}
        ],
    }
    path = tmp_path / "media.yaml"
    path.write_text(yaml.safe_dump(settings))
    image = {"type": "image_url", "image_url": {"url": "http://93.184.215.14/x.png"}}
    body = route.body("word " * 20, model="echo")  # about 28 tokens reserved each time
    body["messages"][-1]["content"] = [{"type": "text", "text": "word " * 20}, image]
    with running_gateway(log_dir, path) as url:
        refused = [chat(url, route.url, KEY, body).status_code for _ in range(4)]
        answered = chat(url, route.url, KEY, route.body("short", model="echo"))
    assert refused == [403] * 4
    assert answered.status_code == 200, answered.text
