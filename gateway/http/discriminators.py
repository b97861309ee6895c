"""A `oneOf` with a `discriminator` (OpenAPI's `propertyName` and `mapping`), validated by the
discriminating property, as the vendors' own servers read it: the block's `type` picks its one
schema. A plain `oneOf` would refuse a body that matches two branches (a block valid under two
schemas) and say only "not valid under any of the given schemas" of a block that is wrong;
read by its discriminator, an unknown `type` is refused naming the property
(`messages[0].content[1].type`), and a known one is held to its own schema, whose error names
the field. Draft 4 has no `if`/`then`, so each branch is written as the implication it is:
"the property is not this value, or the value's schema holds" (`anyOf`), and `underlying` reads
the error of the branch that applied."""

from __future__ import annotations

from typing import Any

import jsonschema_rs


def by_discriminator(converted: dict[str, Any], discriminator: dict[str, Any]) -> dict[str, Any]:
    """A converted schema's `oneOf`, replaced by dispatch on the discriminator's mapping (a
    discriminator without a mapping leaves the `oneOf` as it is)."""
    mapping = discriminator.get("mapping")
    name = discriminator.get("propertyName")
    if not mapping or not name or "oneOf" not in converted:
        return converted
    # each part says it admits other properties: it checks one, the branch's schema the rest
    dispatched = {key: value for key, value in converted.items() if key != "oneOf"}
    dispatched["type"] = "object"
    dispatched["required"] = sorted({*dispatched.get("required", ()), name})
    dispatched["allOf"] = [
        *dispatched.get("allOf", ()),
        {"properties": {name: {"enum": list(mapping)}}, "additionalProperties": True},
        *(
            {
                "anyOf": [
                    {"properties": {name: {"not": {"enum": [value]}}}, "additionalProperties": True},
                    {"$ref": target},
                ]
            }
            for value, target in mapping.items()
        ),
    ]
    return dispatched


def did_not_apply(branch: list[jsonschema_rs.ValidationError], path: list[str | int]) -> bool:
    """Whether a branch failed only because it is not the instance's branch: the instance is of
    another JSON type, or (a dispatch's first branch) the discriminator holds this branch's value."""
    if len(branch) != 1:
        return False
    kind = branch[0].kind
    if isinstance(kind, jsonschema_rs.ValidationErrorKind.Not):
        return True
    return isinstance(kind, jsonschema_rs.ValidationErrorKind.Type) and list(branch[0].instance_path) == path


def underlying(error: jsonschema_rs.ValidationError) -> jsonschema_rs.ValidationError:
    """The error of the one branch that applied, when `error` is an `anyOf`/`oneOf` every other
    branch of which did not apply (a dispatch's, or text-or-blocks content's): the error that
    names the field, not "not valid under any of the schemas"."""
    combinators = (jsonschema_rs.ValidationErrorKind.AnyOf, jsonschema_rs.ValidationErrorKind.OneOfNotValid)
    while isinstance(error.kind, combinators):
        path = list(error.instance_path)
        applied = [branch for branch in error.kind.context if not did_not_apply(branch, path)]
        if len(applied) != 1 or not applied[0]:
            return error
        error = applied[0][0]
    return error
