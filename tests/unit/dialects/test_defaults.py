"""A document's declared defaults, read once at start (gateway/dialects/defaults.py), and each
dialect's translator naming the parameters a body sets only to them (`ChatRequest.defaulted`)."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.app import facts_of
from gateway.dialects.defaults import NO_DEFAULT, Default, declared, defaulted, field_defaults, same_json
from gateway.dialects.registry import DIALECTS
from gateway.http.documents import load_document, resolve
from tests.support.readers import reader

DOCUMENT: dict[str, Any] = {
    "components": {
        "schemas": {
            "Effort": {"type": "string", "enum": ["low", "medium", "high"], "default": "medium"},
            "Options": {
                "type": "object",
                "properties": {
                    "include_usage": {"type": "boolean", "default": False},
                    "level": {"$ref": "#/components/schemas/Effort"},
                    "name": {"type": "string"},
                },
            },
            "Node": {  # a schema that holds itself
                "type": "object",
                "properties": {"child": {"$ref": "#/components/schemas/Node"}, "on": {"default": True}},
            },
        }
    }
}


def read(schema: Any) -> Default | None:
    return declared(schema, lambda node: resolve(DOCUMENT, node))


def test_same_json_tells_booleans_from_numbers():
    assert same_json(1, 1.0) and same_json({"a": [1, "x"]}, {"a": [1.0, "x"]})
    assert not same_json(False, 0) and not same_json(True, 1) and not same_json(1, True)
    assert not same_json({"a": 1}, {"a": 1, "b": 2}) and not same_json([1], 1) and not same_json("1", 1)


def test_a_default_is_read_through_refs_all_of_and_agreeing_branches():
    assert read({"$ref": "#/components/schemas/Effort"}) == Default("medium")
    assert read({"allOf": [{"$ref": "#/components/schemas/Effort"}], "default": "low"}) == Default("low")
    assert read({"allOf": [{"$ref": "#/components/schemas/Effort"}], "nullable": True}) == Default("medium")
    wrapped = read({"allOf": [{"allOf": [{"$ref": "#/components/schemas/Options"}]}]})
    assert wrapped is not None and set(wrapped.members) == {"include_usage", "level"}
    nullable = read({"anyOf": [{"$ref": "#/components/schemas/Effort"}, {"type": "null"}]})
    assert nullable is not None and nullable.value == "medium"
    disagreeing = read({"oneOf": [{"type": "string", "default": "a"}, {"type": "string", "default": "b"}]})
    assert disagreeing is None
    assert read({"type": "string"}) is None


def test_members_of_an_object_are_read_and_a_schema_that_holds_itself_ends():
    options = read({"anyOf": [{"$ref": "#/components/schemas/Options"}, {"type": "null"}]})
    assert options is not None and options.value is NO_DEFAULT
    assert set(options.members) == {"include_usage", "level"}
    node = read({"$ref": "#/components/schemas/Node"})
    assert node is not None and set(node.members) == {"on"}


@pytest.mark.parametrize(
    ("value", "holds"),
    [
        ({"include_usage": False}, True),
        ({"include_usage": False, "level": "medium"}, True),
        ({}, True),  # configures nothing
        ({"level": None}, True),  # null: not set
        ({"include_usage": True}, False),
        ({"level": "high"}, False),
        ({"name": "x"}, False),  # a member without a default is asked for
        ("medium", False),
    ],
)
def test_an_object_is_at_its_default_when_every_member_it_carries_is(value: Any, holds: bool):
    options = read({"$ref": "#/components/schemas/Options"})
    assert options is not None and options.holds(value) is holds


def test_defaulted_names_canonical_parameters_and_needs_every_spelling_at_its_default():
    defaults = field_defaults(
        {"temperature": {"default": 1}, "max_tokens": {"default": 16}, "max_completion_tokens": {}},
        lambda node: node,
    )
    names = {"temperature": "temperature", "max_tokens": "max_tokens", "max_completion_tokens": "max_tokens"}
    assert defaulted(defaults, {"temperature": 1.0, "max_tokens": 16}, names) == {"temperature", "max_tokens"}
    assert defaulted(defaults, {"temperature": 0.5}, names) == frozenset()
    assert defaulted(defaults, {"max_tokens": 16, "max_completion_tokens": 99}, names) == frozenset()
    assert defaulted(defaults, {"temperature": None, "other": 1}, names) == frozenset()


# ----- the dialects' translators ----------------------------------------------------------------

# Each dialect's documented defaults as its clients send them (openapi-generator sends them all),
# and the canonical parameters they are.
AT_DEFAULTS: dict[str, tuple[dict[str, Any], set[str]]] = {
    "openai": (
        {
            "reasoning_effort": "medium", "verbosity": "medium", "store": False,
            "service_tier": "auto", "temperature": 1, "top_p": 1.0, "parallel_tool_calls": True,
            "frequency_penalty": 0, "presence_penalty": 0, "n": 1,
            "web_search_options": {"search_context_size": "medium"},
        },
        {
            "reasoning_effort", "verbosity", "store", "service_tier", "temperature", "top_p",
            "parallel_tool_calls", "frequency_penalty", "presence_penalty", "n", "web_search_options",
        },
    ),
    "azure": (
        {"temperature": 1, "top_p": 1, "frequency_penalty": 0},
        {"temperature", "top_p", "frequency_penalty"},
    ),
    "lmi": ({"ignore_eos": False, "temperature": 1.0}, {"ignore_eos", "temperature"}),
    "ovms": (
        {
            "ignore_eos": False, "best_of": 1, "length_penalty": 1, "repetition_penalty": 1.0,
            "seed": 0,
        },
        {"ignore_eos", "best_of", "length_penalty", "repetition_penalty", "seed"},
    ),
    "aleph_alpha": ({"temperature": 1, "top_p": 1}, {"temperature", "top_p"}),
    # a parent without a default of its own, carrying its members' (OVMS takes it streamed only)
    "ovms streamed": ({"stream": True, "stream_options": {"include_usage": False}}, {"stream_options"}),
}  # fmt: skip


def translator(dialect: str) -> Any:
    found = DIALECTS[dialect]
    return found.translator(facts_of(load_document(found.document), found.chat_operations))


@pytest.mark.parametrize("dialect", AT_DEFAULTS)
def test_each_dialect_names_what_its_body_sets_to_the_documents_defaults(dialect: str):
    sent, names = AT_DEFAULTS[dialect]
    dialect = dialect.split()[0]
    request = translator(dialect).read(reader(dialect).body(model="m", **sent))
    assert request.defaulted == names
    assert request.temperature == sent.get("temperature")  # read as sent: only the refusal changes


@pytest.mark.parametrize(
    ("dialect", "sent", "name"),
    [
        ("openai", {"reasoning_effort": "high"}, "reasoning_effort"),
        ("openai", {"verbosity": "low"}, "verbosity"),
        ("openai", {"web_search_options": {"search_context_size": "high"}}, "web_search_options"),
        ("openai", {"temperature": 0.5}, "temperature"),
        ("lmi", {"ignore_eos": True}, "ignore_eos"),
        ("ovms", {"repetition_penalty": 1.2}, "repetition_penalty"),
        ("ovms", {"stream": True, "stream_options": {"include_usage": True}}, "stream_options"),
    ],
)
def test_a_value_away_from_the_default_is_not_named(dialect: str, sent: dict[str, Any], name: str):
    request = translator(dialect).read(reader(dialect).body(model="m", **sent))
    assert name not in request.defaulted


def test_the_responses_api_names_its_defaults_under_canonical_names():
    openai = DIALECTS["openai"]
    (operation_id, own) = next(iter(openai.own_chat.items()))
    responses = own.translator(facts_of(load_document(openai.document), (operation_id,)))
    body = {
        "model": "m",
        "input": "Hi",
        "temperature": 1,
        "top_p": 1,
        "parallel_tool_calls": True,
        "store": True,
    }
    assert responses.read(body).defaulted == {"temperature", "top_p", "parallel_tool_calls"}
    assert responses.read({**body, "temperature": 0.2}).defaulted == {"top_p", "parallel_tool_calls"}
