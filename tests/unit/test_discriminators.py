"""A `oneOf` with a discriminator, validated by it (gateway/http/discriminators.py): an unknown
value is refused at the property, a known one held to its own branch (the error names the
field, not "valid under none of the schemas"), and a text-or-blocks `oneOf` names the block's
error, not the `oneOf`'s."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.http.validation import compile_schema, validation_error

COMPONENTS = {
    "schemas": {
        "Text": {
            "type": "object",
            "required": ["type", "text"],
            "properties": {"type": {"enum": ["text"]}, "text": {"type": "string"}},
        },
        "Image": {
            "type": "object",
            "required": ["type", "url"],
            "properties": {"type": {"enum": ["image"]}, "url": {"type": "string"}},
        },
        "Block": {
            "oneOf": [{"$ref": "#/components/schemas/Text"}, {"$ref": "#/components/schemas/Image"}],
            "discriminator": {
                "propertyName": "type",
                "mapping": {"text": "#/components/schemas/Text", "image": "#/components/schemas/Image"},
            },
        },
    }
}
CONTENT = {
    "type": "object",
    "properties": {
        "content": {
            "oneOf": [{"type": "string"}, {"type": "array", "items": {"$ref": "#/components/schemas/Block"}}]
        }
    },
}
VALIDATOR = compile_schema(CONTENT, COMPONENTS)


def refused(body: Any) -> tuple[str, list[Any]]:
    error = validation_error(next(VALIDATOR.iter_errors(body)))
    assert error.loc is not None
    return error.message, error.loc


@pytest.mark.parametrize(
    "body",
    [
        {"content": "text"},
        {"content": [{"type": "text", "text": "a"}, {"type": "image", "url": "u", "more": 1}]},
    ],
)
def test_valid_bodies_pass(body: Any):
    assert list(VALIDATOR.iter_errors(body)) == []


def test_an_unknown_type_is_refused_at_the_property():
    message, loc = refused({"content": [{"type": "text", "text": "a"}, {"type": "video"}]})
    assert loc == ["body", "content", 1, "type"] and '"video"' in message


def test_a_known_type_is_held_to_its_own_schema():
    assert refused({"content": [{"type": "image"}]}) == (
        "Invalid request body: \"url\" is a required property at 'content[0]'",
        ["body", "content", 0],
    )
    message, loc = refused({"content": [{"type": "text", "text": 5}]})
    assert loc == ["body", "content", 0, "text"] and "not of type" in message


def test_a_body_of_neither_form_is_the_oneofs_error():
    message, loc = refused({"content": 5})
    assert loc == ["body", "content"] and "oneOf" in message
