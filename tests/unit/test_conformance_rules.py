"""`chatgate conformance` judges generated bodies by the document's `x-chatgate-rules`: a positive
case that breaks one becomes a negative case (which the endpoint must refuse), so a gateway that
does not enforce a rule fails negative_data_rejection instead of being spared by reshaped bodies."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from schemathesis.core.parameters import ParameterLocation
from schemathesis.generation import GenerationMode

from gateway.http.documents import load_document
from gateway.tools.conformance import shape_cases

MESSAGES = [{"role": "user", "content": "Hi"}]
NEGATIVE, POSITIVE = GenerationMode.NEGATIVE, GenerationMode.POSITIVE


def case(body: dict[str, Any]) -> Any:
    meta = SimpleNamespace(
        generation=SimpleNamespace(mode=GenerationMode.POSITIVE),
        components={ParameterLocation.BODY: SimpleNamespace(mode=GenerationMode.POSITIVE)},
    )
    operation = SimpleNamespace(method="POST", path="/chat/completions")
    return SimpleNamespace(operation=operation, body=body, meta=meta, headers=None)


@pytest.mark.parametrize(
    ("dialect", "body", "mode"),
    [
        ("ovms", {"model": "m", "messages": MESSAGES, "stream": True, "logprobs": True}, NEGATIVE),
        ("ovms", {"model": "m", "messages": MESSAGES, "n": 2}, NEGATIVE),
        ("ovms", {"model": "m", "messages": MESSAGES, "n": 2, "best_of": 2}, POSITIVE),
        ("openai", {"model": "m", "messages": MESSAGES, "top_logprobs": 1}, NEGATIVE),
        ("openai", {"model": "m", "messages": MESSAGES, "logprobs": True, "top_logprobs": 1}, POSITIVE),
        ("azure", {"messages": MESSAGES, "top_logprobs": 1}, POSITIVE),  # stripped: not defined
    ],
)
def test_a_positive_body_that_breaks_a_rule_is_judged_negative(dialect: str, body: dict, mode: Any):
    mapped = shape_cases(dialect, load_document(f"{dialect}.yaml"))(None, case(body))
    assert mapped.meta.generation.mode == mode
    assert mapped.meta.components[ParameterLocation.BODY].mode == mode
    assert set(mapped.body) <= set(body)  # judged, not reshaped


def test_the_aleph_alpha_message_order_still_shapes_positive_bodies():
    body = {"model": "m", "messages": [{"role": "assistant", "content": "x"}, *MESSAGES]}
    mapped = shape_cases("aleph_alpha", load_document("aleph_alpha.yaml"))(None, case(body))
    assert [m["role"] for m in mapped.body["messages"]] == ["user"]


def negative(body: dict[str, Any]) -> Any:
    made = case(body)
    made.meta.generation.mode = NEGATIVE
    return made


@pytest.mark.parametrize(
    ("dialect", "made", "seed"),
    [
        ("openai", case({"model": "m", "messages": MESSAGES}), 7),  # asks for the run's
        ("ovms", case({"model": "m", "messages": MESSAGES}), 7),
        ("openai", case({"model": "m", "messages": MESSAGES, "seed": 3}), 3),  # keeps its own
        ("openai", negative({"model": "m", "messages": MESSAGES}), None),  # left as generated
        ("aleph_alpha", case({"model": "m", "messages": MESSAGES}), None),  # its seed is ignored
    ],
)
def test_with_a_run_seed_a_positive_chat_request_asks_for_it(dialect: str, made: Any, seed: int | None):
    """--seed: a server that honours `seed` answers a repeated run the same."""
    mapped = shape_cases(dialect, load_document(f"{dialect}.yaml"), seed=7 + 2**32)(None, made)
    assert mapped.body.get("seed") == seed
