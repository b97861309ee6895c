"""The policy's order is said once, in gateway/policy/pipeline.py, and the README's lists are
that order; each deployment's lists hold only the steps it has something for."""

from __future__ import annotations

import re

import pytest

from gateway.config.settings import Settings
from gateway.policy.auth import new_key
from gateway.policy.pipeline import ADMISSION, ANSWER_ITEMS, ANSWER_USAGE, ROUTE
from gateway.runtime import Runtime
from tests.support.servers import ROOT

README = (ROOT / "README.md").read_text(encoding="utf-8")
POLICY_SECTION = README.split("### Policy\n", 1)[1].split("\n### ", 1)[0]


def numbered_lists(text: str) -> list[list[str]]:
    """The section's numbered lists, each item's text."""
    found: list[list[str]] = []
    previous = False
    for line in text.splitlines():
        if match := re.fullmatch(r"\d+\. (.+)", line):
            if not previous:
                found.append([])
            found[-1].append(match[1])
        previous = bool(match)
    return found


def test_the_readme_lists_the_pipelines_order():
    assert numbered_lists(POLICY_SECTION) == [
        [ROUTE.title, *(kind.title for kind in ADMISSION)],
        [kind.title for kind in ANSWER_USAGE],
        [kind.title for kind in ANSWER_ITEMS],
    ]


def kinds(steps: list) -> list[str]:
    return [type(step).__name__ for step in steps]


# a backend that sets no default max_tokens of its own
PLAIN = {"name": "plain", "backend": "openai-compatible", "options": {"base_url": "http://127.0.0.1:9"}}
ALWAYS = ["ExtraParameters", "CountPrompt", "CheckCapabilities"]


def test_a_deployment_with_no_policy_configured_runs_only_what_every_request_needs():
    runtime = Runtime(Settings.model_validate({"deployments": [PLAIN]}))
    steps = runtime.pipeline.steps["plain"]
    assert kinds(steps.admission) == ALWAYS
    assert kinds(steps.screening) == [*kinds(steps.admission), "MediaScreen"]
    assert steps.usage == [] and steps.items == []


@pytest.mark.parametrize(
    ("configured", "admission", "usage", "stream"),
    [
        ({"keys": [{"name": "a", "sha256": new_key()[1]}]}, ["KeyMayUse"], [], []),
        (
            {"keys": [{"name": "a", "sha256": new_key()[1], "limits": {"requests_per_minute": 5}}]},
            ["KeyMayUse", "RateLimits"],
            ["ChargeTokenLimits"],
            [],
        ),
        (
            {"keys": [{"name": "a", "sha256": new_key()[1], "budgets": [{"tokens": 9, "per": "day"}]}]},
            ["KeyMayUse", "Budgets"],
            ["SettleBudgets"],
            ["ReleaseUnsettled"],
        ),
        ({"content_filter": {"input": {"words": ["x"]}}}, ["PromptFilter"], [], []),
        ({"content_filter": {"output": {"words": ["x"]}}}, [], [], ["OutputFilter"]),
        ({"deployment": {"limits": {"tokens_per_minute": 5}}}, ["RateLimits"], ["ChargeTokenLimits"], []),
        ({"deployment": {"price": {"input": 1.0, "output": 2.0}}}, [], ["Cost"], []),
        ({"deployment": {"capabilities": {"default_max_tokens": 64}}}, ["DefaultMaxTokens"], [], []),
    ],
)
def test_a_step_is_in_a_deployments_list_only_where_configured(configured, admission, usage, stream):
    deployment = {**PLAIN, **configured.pop("deployment", {})}
    runtime = Runtime(Settings.model_validate({**configured, "deployments": [deployment]}))
    steps = runtime.pipeline.steps["plain"]
    assert [kind for kind in kinds(steps.admission) if kind not in ALWAYS] == admission
    assert kinds(steps.usage) == usage
    assert kinds(steps.items) == stream
