"""A validator is compiled with only the components its schema reaches (gateway/http/validation.py):
every `$ref`, followed through, and each discriminator's mapping targets, which the dispatch
turns into `$ref`s; nothing else of the document."""

from __future__ import annotations

from gateway.http.validation import compile_schema, reachable

COMPONENTS = {
    "schemas": {
        "Request": {"type": "object", "properties": {"part": {"$ref": "#/components/schemas/Part"}}},
        "Part": {
            "oneOf": [{"$ref": "#/components/schemas/Text"}],
            "discriminator": {
                "propertyName": "type",
                "mapping": {"text": "#/components/schemas/Text", "a/b": "#/components/schemas/Slash~1Name"},
            },
        },
        "Text": {"type": "object", "required": ["text"], "properties": {"text": {"type": "string"}}},
        "Slash/Name": {"type": "object", "required": ["n"]},
        "Unused": {"type": "string"},
    }
}


def test_only_what_the_schema_reaches_is_kept() -> None:
    found = reachable({"$ref": "#/components/schemas/Request"}, COMPONENTS)
    assert sorted(found["schemas"]) == ["Part", "Request", "Slash/Name", "Text"]


def test_a_schema_without_refs_takes_no_components() -> None:
    assert reachable({"type": "string"}, COMPONENTS) == {}


def test_a_validator_compiled_so_still_checks_through_the_mapping() -> None:
    validator = compile_schema({"$ref": "#/components/schemas/Request"}, COMPONENTS)
    assert validator.is_valid({"part": {"type": "text", "text": "hi"}})
    assert not validator.is_valid({"part": {"type": "text", "text": 1}})
    assert not validator.is_valid({"part": {"type": "a/b"}})  # held to Slash/Name: `n` required
    assert validator.is_valid({"part": {"type": "a/b", "n": 1}})
