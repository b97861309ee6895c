"""The policy's order is said once, in gateway/policy/pipeline.py, and the docs' lists
(docs/configuration/policy.md) are that order; each deployment's lists hold only the steps it
has something for."""

from __future__ import annotations

import asyncio
import re

import pytest

from gateway.config.settings import Settings
from gateway.core.canonical import ChatRequest, Finish, Folded, Item, TextDelta, Usage, each
from gateway.policy.auth import ANONYMOUS, new_key
from gateway.policy.pipeline import ADMISSION, ANSWER_ITEMS, ANSWER_USAGE, ROUTE, Pipeline
from gateway.runtime import Runtime
from gateway.telemetry.record import RequestRecord
from tests.support.servers import ROOT

POLICY_SECTION = (ROOT / "docs" / "configuration" / "policy.md").read_text(encoding="utf-8")


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


def test_the_docs_list_the_pipelines_order():
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


class Told:
    """A dispatch that answers with the items it was given (streamed or whole), through the
    answer's screen as the dispatcher's loop puts them (gateway/fleet/dispatch.py)."""

    def __init__(self, items: list[Item]) -> None:
        self.items = items
        self.screens: list[object] = []

    def passed(self, screen):
        self.screens.append(screen)
        for item in self.items:
            if screen is None:
                yield item
            elif (passed := screen(item)) is not None:
                yield passed

    async def events(self, deployment, request, record, on_usage=None, queue=None, screen=None):
        for item in self.passed(screen):
            yield item

    async def complete(self, deployment, request, record, take, on_usage=None, screen=None):
        for item in self.passed(screen):
            take(item)


ANSWER: list[Item] = [
    TextDelta(0, "a grey ", None),
    [TextDelta(0, "zebra runs", None), Finish(0, "stop")],
    Usage(3, 4),
]


def through(configured: dict, stream: bool) -> tuple[list, object]:
    """The answer's events after the policy's item steps, and the dispatcher's own stream."""
    runtime = Runtime(Settings.model_validate({**configured, "deployments": [PLAIN]}))
    told = Told(ANSWER)
    pipeline = Pipeline(runtime.policy, runtime.router, told)
    request = ChatRequest(model="plain", messages=[{"role": "user", "content": "hi"}], stream=stream)

    async def answered() -> tuple[list, object]:
        admission = await pipeline.admit(request, {}, ANONYMOUS, RequestRecord("id", "POST", "/"))
        if not stream:
            taken: list[Item] = []
            await pipeline.complete(admission, taken.append)
            return [event for item in taken for event in each(item)], None
        events = pipeline.answer(admission)
        got = [event async for item in events for event in each(item)]
        await pipeline.end(admission)
        return got, events

    return asyncio.run(answered())


@pytest.mark.parametrize("stream", [True, False])
def test_an_answer_streamed_or_whole_goes_through_the_same_item_steps(stream):
    screened, _ = through({"content_filter": {"output": {"words": ["zebra"]}}}, stream)
    assert screened == [TextDelta(0, "a grey ", None), Finish(0, "content_filter"), Usage(3, 4)]
    folded = Folded()
    folded.add_item(screened)
    assert folded.completion().choices[0].text == "a grey "


def test_a_stream_nothing_screens_is_the_dispatchers_own():
    """No generator layer of the policy's own where no step screens the items."""
    events, stream = through({}, stream=True)
    assert events == [event for item in ANSWER for event in each(item)]
    assert getattr(stream, "__qualname__", "") == "Told.events"
