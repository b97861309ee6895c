"""A value a dialect's document declares as the default is never refused by a capability check,
whatever the backend, and still reaches a backend that takes it; a value away from the default
that the backend cannot honour keeps its 422 naming it. `reasoning_effort: "none"` asks for no
reasoning, which a model without reasoning honours by doing nothing."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from backends.base import Capabilities, Param, to_send
from backends.local import sampling as local_sampling
from backends.openai_compatible import OpenAICompatibleBackend
from backends.tgi import options as tgi_options
from backends.tgi import tables as tgi_tables
from backends.tgi.request import plan_request
from gateway.app import facts_of
from gateway.core.canonical import ChatRequest
from gateway.core.errors import UnprocessableContent
from gateway.dialects.registry import DIALECTS
from gateway.http.documents import load_document
from gateway.policy import capabilities
from tests.support.readers import reader

TGI = tgi_options.TGIOptions(url="http://tgi")
MESSAGES_API_ONLY = tgi_options.TGIOptions(url="http://tgi", use_messages_api=True)
TABLES: dict[str, Mapping[str, Param]] = {
    "tgi": tgi_tables.parameter_table(TGI),
    "tgi messages api only": tgi_tables.parameter_table(MESSAGES_API_ONLY),
    "local": local_sampling.parameter_table(context_length=512, vocab_size=100),
}  # fmt: skip
# What generated clients and openai-agents send: each dialect's documented defaults
DEFAULTS: dict[str, dict[str, Any]] = {
    "openai": {
        "reasoning_effort": "medium", "verbosity": "medium", "store": False, "service_tier": "auto",
        "temperature": 1, "top_p": 1, "parallel_tool_calls": True, "frequency_penalty": 0,
        "presence_penalty": 0, "n": 1, "logprobs": False, "logit_bias": None,
    },
    "lmi": {"ignore_eos": False, "temperature": 1, "top_p": 1, "n": 1, "presence_penalty": 0},
    "ovms": {
        "ignore_eos": False, "best_of": 1, "length_penalty": 1.0, "repetition_penalty": 1.0,
        "seed": 0, "temperature": 1.0, "top_p": 1.0, "presence_penalty": 0.0,
    },
}  # fmt: skip


def read(dialect: str, **sent: Any) -> ChatRequest:
    found = DIALECTS[dialect]
    translator = found.translator(facts_of(load_document(found.document), found.chat_operations))
    return translator.read(reader(dialect).body(model="m", **sent))


def admit(request: ChatRequest, backend: str) -> None:
    capabilities.check(request, Capabilities(parameters=TABLES[backend], max_n=4), prompt_tokens=1)


@pytest.mark.parametrize("backend", TABLES)
@pytest.mark.parametrize("dialect", DEFAULTS)
def test_the_documents_defaults_are_admitted(dialect: str, backend: str):
    admit(read(dialect, **DEFAULTS[dialect]), backend)


@pytest.mark.parametrize(
    ("dialect", "name", "value"),
    [
        ("openai", "reasoning_effort", "high"),
        ("openai", "verbosity", "low"),  # a shorter answer: no model here can be told so
        ("openai", "verbosity", "high"),
        ("lmi", "ignore_eos", True),
        ("ovms", "best_of", 2),
        ("ovms", "length_penalty", 0.5),
    ],
)
def test_a_value_away_from_the_default_is_refused_naming_it(dialect: str, name: str, value: Any):
    for backend in ("tgi", "local"):
        if backend == "local" and name == "ignore_eos":
            continue  # the local backend takes it
        with pytest.raises(UnprocessableContent) as refused:
            admit(read(dialect, **{**DEFAULTS[dialect], name: value}), backend)
        assert refused.value.param == name and f"'{name}'" in refused.value.message


def test_out_of_range_away_from_the_default_is_still_refused():
    with pytest.raises(UnprocessableContent, match="presence_penalty"):  # TGI takes only 0
        admit(read("openai", presence_penalty=0.5), "tgi")


@pytest.mark.parametrize("backend", TABLES)
def test_reasoning_effort_none_asks_for_no_reasoning_and_is_admitted(backend: str):
    admit(read("openai", reasoning_effort="none", verbosity="medium"), backend)
    with pytest.raises(UnprocessableContent, match="reasoning_effort"):
        admit(read("openai", reasoning_effort="minimal"), backend)


def test_openai_agents_default_agent_in_chat_mode_gets_its_verbosity_refused_not_its_effort():
    """openai-agents' default gpt-5 settings: reasoning_effort "none" and verbosity "low"."""
    with pytest.raises(UnprocessableContent) as refused:
        admit(read("openai", reasoning_effort="none", verbosity="low"), "tgi")
    assert refused.value.param == "verbosity"


# ----- what the backends send -------------------------------------------------------------------


def test_a_backend_that_takes_a_default_is_sent_it():
    request = read("openai", **DEFAULTS["openai"])
    body = OpenAICompatibleBackend(model="m", base_url="http://127.0.0.1:1/v1").upstream_body(request)
    expected = {"reasoning_effort": "medium", "verbosity": "medium", "temperature": 1, "top_p": 1}
    assert expected.items() <= body.items()
    assert body["store"] is False and body["service_tier"] == "auto" and body["parallel_tool_calls"] is True


def test_a_backend_that_cannot_take_a_default_leaves_it_out():
    request = read("openai", **DEFAULTS["openai"])
    sent = to_send(TABLES["tgi"], request)
    assert "reasoning_effort" not in sent and "verbosity" not in sent
    assert sent["temperature"] == 1 and sent["top_p"] == 1


def test_tgi_picks_no_route_for_a_default_and_sends_it_where_the_route_takes_it():
    tables = tgi_tables.RouteTables.for_options(TGI)
    plan = plan_request(read("ovms", **DEFAULTS["ovms"]), tables)
    assert plan.route == "messages"
    assert {"ignore_eos", "best_of", "length_penalty", "repetition_penalty"}.isdisjoint(plan.values)
    assert plan.values["temperature"] == 1.0 and plan.values["seed"] == 0
    # a real generate-only knob picks the generate API, and the default goes with it there
    plan = plan_request(read("ovms", **{**DEFAULTS["ovms"], "top_k": 5}), tables)
    assert plan.route == "generate" and plan.knobs == {"top_k": 5}
    assert plan.values["repetition_penalty"] == 1.0 and "ignore_eos" not in plan.values
    # a deployment on the Messages API only: the default needs no generate API
    only = plan_request(
        read("ovms", **DEFAULTS["ovms"]), tgi_tables.RouteTables.for_options(MESSAGES_API_ONLY)
    )
    assert only.route == "messages" and "repetition_penalty" not in only.values
    # tools beside a defaulted generate-only parameter: still the Messages API
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    plan = plan_request(read("ovms", repetition_penalty=1.0, tools=[tool]), tables)
    assert plan.route == "messages" and "tools" in plan.values


def test_the_local_backend_sets_the_defaults_it_takes_and_leaves_out_the_others():
    table = TABLES["local"]
    request = read("ovms", **{**DEFAULTS["ovms"], "ignore_eos": False})
    sampling = local_sampling.sampling_for(request, table, None)
    assert sampling.ignore_eos is False and sampling.temperature == 1.0 and sampling.seed == 0
    openai = local_sampling.sampling_for(read("openai", **DEFAULTS["openai"]), table, None)
    assert openai.temperature == 1.0
