"""Every dialect's rules between fields (its document's `x-chatgate-rules`, read by
gateway/dialects/rules.py), one table for all: each rule has a body that breaks it (400 in the
dialect's shape, naming the parameter) and a body next to it that keeps it (read as usual)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import pytest

from gateway.core.errors import BadRequest
from gateway.dialects.registry import DIALECTS
from gateway.dialects.rules import first_breach, read_rules
from tests.support.documents import response_errors
from tests.unit.dialects import cases
from tests.unit.dialects.cases import MINIMAL_BODY

ASSISTANT = {"role": "assistant"}
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
CUSTOM_TOOL = {"type": "custom", "custom": {"name": "c"}}
OTHER_TOOL = {"type": "function", "function": {"name": "g"}}
NAMED_F = {"type": "function", "function": {"name": "f"}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


@dataclass(frozen=True)
class RuleCase:
    dialect: str
    rule: str
    breaks: dict[str, Any]  # added to the minimal body: refused
    keeps: dict[str, Any]  # added to the minimal body: read
    param: str
    loc: list[str | int]

    @property
    def id(self) -> str:
        return f"{self.dialect}: {self.rule}"


def conversation(*messages: dict[str, Any]) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": "Hi"}, *messages, {"role": "user", "content": "?"}]}


def row(dialect: str, rule: str, breaks: dict, keeps: dict, param: str, *loc: str | int) -> RuleCase:
    return RuleCase(dialect, rule, breaks, keeps, param, ["body", *(loc or (param,))])


ONE_USAGE = {"stream_options": {"include_usage": True}}
STREAMED = {"stream": True}
KNOBS = {"num_assistant_tokens": 3}
CASES = [
    # OpenAI: the seed's rules, and its map keys
    row(
        "openai",
        "top_logprobs-needs-logprobs",
        {"top_logprobs": 2},
        {"top_logprobs": 2, "logprobs": True},
        "top_logprobs",
    ),
    row(
        "openai",
        "top_logprobs-needs-logprobs",
        {"top_logprobs": 0, "logprobs": False},
        {"top_logprobs": None},
        "top_logprobs",
    ),
    row("openai", "stream_options-needs-stream", ONE_USAGE, {**ONE_USAGE, **STREAMED}, "stream_options"),
    row(
        "openai",
        "stream_options-needs-stream",
        {"stream_options": {}, "stream": False},
        {"stream_options": None, "stream": False},
        "stream_options",
    ),
    row(
        "openai",
        "metadata-key-length",
        {"metadata": {"k" * 65: "v"}},
        {"metadata": {"k" * 64: "v"}},
        "metadata",
    ),
    row(
        "openai",
        "logit_bias-keys-are-token-ids",
        {"logit_bias": {"abc": 1}},
        {"logit_bias": {"50256": 1}},
        "logit_bias",
    ),
    row(
        "openai",
        "logit_bias-keys-are-token-ids",
        {"logit_bias": {"-1": 1}},
        {"logit_bias": {"0": 1}},
        "logit_bias",
    ),
    row(
        "openai",
        "assistant-content-or-calls",
        conversation(ASSISTANT),
        conversation({**ASSISTANT, "content": "Hello."}),
        "messages[1]",
        "messages",
        1,
    ),
    row(
        "openai",
        "assistant-content-or-calls",
        conversation({**ASSISTANT, "content": None, "tool_calls": []}),
        conversation({**ASSISTANT, "content": None, "tool_calls": [CALL]}),
        "messages[1]",
        "messages",
        1,
    ),
    row(
        "openai",
        "assistant-content-or-calls",
        conversation({**ASSISTANT, "function_call": None}),
        conversation({**ASSISTANT, "function_call": {"name": "f", "arguments": "{}"}}),
        "messages[1]",
        "messages",
        1,
    ),
    # OVMS: the seed's and its parser's rules
    row(
        "ovms",
        "logprobs-not-streamed",
        {"logprobs": True, **STREAMED},
        {"logprobs": False, **STREAMED},
        "logprobs",
    ),
    row("ovms", "best_of-not-streamed", {"best_of": 2, **STREAMED}, {"best_of": 1, **STREAMED}, "best_of"),
    row("ovms", "n-at-most-best_of", {"n": 2}, {"n": 2, "best_of": 2}, "n"),
    row("ovms", "n-at-most-best_of", {"n": 2, "best_of": None}, {"n": 1, "best_of": None}, "n"),
    row("ovms", "n-at-most-best_of", {"n": 2, **STREAMED}, {"n": 1, **STREAMED}, "n"),
    row("ovms", "stream_options-needs-stream", ONE_USAGE, {**ONE_USAGE, **STREAMED}, "stream_options"),
    row(
        "ovms",
        "stop-string-kept-when-streaming",
        {"include_stop_str_in_output": False, **STREAMED},
        {"include_stop_str_in_output": False},
        "include_stop_str_in_output",
    ),
    row(
        "ovms",
        "one-speculative-knob",
        {**KNOBS, "assistant_confidence_threshold": 0.5},
        {**KNOBS, "assistant_confidence_threshold": None},
        "assistant_confidence_threshold",
    ),
    # Aleph Alpha: its official client's name for the token limit, beside the seed's
    row(
        "aleph_alpha",
        "one-token-limit",
        {"max_tokens": 5, "maximum_tokens": 5},
        {"maximum_tokens": 5},
        "maximum_tokens",
    ),
    # issue 26's seed rules: tools a tool_choice needs, audio beside the audio modality, and
    # logit_bias keys on every dialect that has logit_bias
    *(
        row(dialect, "required-tool_choice-needs-tools", breaks, {**breaks, "tools": [TOOL]}, "tool_choice")
        for dialect in ("openai", "azure", "aleph_alpha")
        for breaks in ({"tool_choice": "required"}, {"tool_choice": "required", "tools": None})
    ),
    *(
        row(dialect, "named-tool_choice-among-tools", breaks, {**breaks, "tools": [TOOL]}, "tool_choice")
        for dialect in ("openai", "azure", "ovms", "aleph_alpha")
        for breaks in ({"tool_choice": NAMED_F}, {"tool_choice": NAMED_F, "tools": [OTHER_TOOL]})
    ),
    row(
        "openai",
        "named-custom-tool_choice-among-tools",
        {"tool_choice": {"type": "custom", "custom": {"name": "c"}}, "tools": [TOOL]},
        {"tool_choice": {"type": "custom", "custom": {"name": "c"}}, "tools": [CUSTOM_TOOL]},
        "tool_choice",
    ),
    row(
        "openai",
        "named-function_call-among-functions",
        {"function_call": {"name": "f"}, "functions": [{"name": "g"}]},
        {"function_call": {"name": "f"}, "functions": [{"name": "f"}]},
        "function_call",
    ),
    row(
        "openai",
        "audio-modality-needs-audio",
        {"modalities": ["text", "audio"]},
        {"modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "wav"}},
        "audio",
    ),
    *(
        row(
            dialect,
            "logit_bias-keys-are-token-ids",
            {"logit_bias": {"abc": 1}},
            {"logit_bias": {"7": 1}},
            "logit_bias",
        )
        for dialect in ("aleph_alpha", "lmi")
    ),
]


def borrowed(cases_written: list[RuleCase]) -> list[RuleCase]:
    """A rule a dialect's document states with no row written for that dialect takes the rows of
    the same rule written for another (a dialect made from a copy of another's document needs
    none of its own); the tests below then hold its translator to them."""
    found = []
    for dialect in DIALECTS:
        own = {case.rule for case in cases_written if case.dialect == dialect}
        for rule in sorted({rule.name for rule in cases.translator(dialect).facts.rules} - own):
            donor = next((case.dialect for case in cases_written if case.rule == rule), None)
            found += [
                RuleCase(dialect, rule, case.breaks, case.keeps, case.param, case.loc)
                for case in cases_written
                if case.rule == rule and case.dialect == donor
            ]
    return found


CASES += borrowed(CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_a_body_that_breaks_the_rule_is_refused(case: RuleCase):
    translator = cases.translator(case.dialect)
    with pytest.raises(BadRequest) as raised:
        translator.read({**MINIMAL_BODY, **case.breaks})
    error = raised.value
    assert (error.status, error.param, error.loc) == (400, case.param, case.loc)
    rendered = translator.error(error, "request-1")
    assert rendered.status == 400
    document, path = DIALECTS[case.dialect].document, cases.CHAT_PATHS[case.dialect]
    assert response_errors(document, path, "post", 400, rendered.body) == []


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_the_body_beside_it_keeps_the_rule(case: RuleCase):
    cases.translator(case.dialect).read({**MINIMAL_BODY, **case.keeps})


@pytest.mark.parametrize("dialect", DIALECTS)
def test_every_rule_of_every_document_has_a_row(dialect: str):
    stated = {rule.name for rule in cases.translator(dialect).facts.rules}
    assert stated == {case.rule for case in CASES if case.dialect == dialect}


def test_greater_reads_an_absent_or_null_value_as_its_default():
    (rule,) = read_rules(
        {"x-chatgate-rules": [{"name": "r", "param": "a", "message": "{a} > {b}", "greater": ["a", "b"]}]},
        {"a": 1, "b": 1},
    )
    assert rule.holds_for({}) and rule.holds_for({"a": 1, "b": None}) and rule.holds_for({"a": 2, "b": 3})
    assert not rule.holds_for({"a": 2}) and not rule.holds_for({"a": 2, "b": None})
    assert rule.holds_for({"a": "x", "b": 1})  # not numbers: the schema's business, not the rule's
    (error,) = rule.breaches({"a": 2})
    assert error.message == "2 > 1"


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_rule_passed_over_for_a_missing_gate_is_one_the_body_keeps(dialect: str):
    """`first_breach` passes over a rule when the body lacks one of its gates; for every row's
    bodies, and each of them with one parameter taken out, that is the verdict the rule itself
    gives: what it says, and the error it raises, are those of every rule read in full."""
    rules = cases.translator(dialect).facts.rules
    ungated = tuple(replace(rule, gates=()) for rule in rules)
    assert any(rule.gates for rule in rules) or not rules
    bodies = []
    for case in CASES:
        for added in (case.breaks, case.keeps):
            body = {**MINIMAL_BODY, **added}
            bodies += [body, *({k: v for k, v in body.items() if k != left} for left in body)]
    checked = 0
    for body in bodies:
        gated, full = first_breach(rules, body), first_breach(ungated, body)
        assert (gated and (gated.message, gated.param, gated.loc)) == (
            full and (full.message, full.param, full.loc)
        )
        for rule in rules:
            if any(name not in body for name in rule.gates):
                assert list(rule.breaches(body)) == []
                checked += 1
    assert checked or not rules
