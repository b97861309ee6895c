"""The defaults a dialect's document declares for the fields of its chat body, read once at start.

A client that sends a field at its declared default asks for nothing more than one that leaves
it out (generated clients send every default: `reasoning_effort: "medium"`, `ignore_eos:
false`, …). The translator names such parameters in the canonical request's `defaulted`, so no
capability check refuses them (gateway/core/parameters.py, `unasked`); a backend that takes
them is still sent them. An object is at its default when it equals its own declared default,
or when every member it carries is at the member's (`stream_options: {include_usage: false}`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

Resolve = Callable[[Any], Any]  # a schema node with its `$ref`s followed


class _NoDefault:
    def __repr__(self) -> str:
        return "NO_DEFAULT"


NO_DEFAULT: Any = _NoDefault()


def same_json(first: Any, second: Any) -> bool:
    """Equal as JSON values: 1 and 1.0 are, `false` and 0 are not."""
    if isinstance(first, bool) or isinstance(second, bool):
        return first is second
    if isinstance(first, Mapping) and isinstance(second, Mapping):
        return first.keys() == second.keys() and all(same_json(v, second[k]) for k, v in first.items())
    if isinstance(first, list | tuple) and isinstance(second, list | tuple):
        return len(first) == len(second) and all(map(same_json, first, second))
    if isinstance(first, Mapping | list | tuple) or isinstance(second, Mapping | list | tuple):
        return False
    return bool(first == second)


@dataclass(frozen=True, slots=True)
class Default:
    """A field's declared default, and those of its members where it is an object."""

    value: Any = NO_DEFAULT
    members: Mapping[str, Default] = field(default_factory=dict)

    def holds(self, value: Any) -> bool:
        """Whether `value` asks for no more than the default (null is not setting it)."""
        if value is None or (self.value is not NO_DEFAULT and same_json(value, self.value)):
            return True
        members = self.members
        return (
            bool(members)
            and isinstance(value, Mapping)
            and all(name in members and members[name].holds(member) for name, member in value.items())
        )


def declared(schema: Any, resolve: Resolve, path: tuple[int, ...] = ()) -> Default | None:
    """The defaults `schema` declares for a value and its members (following `$ref`, `allOf`,
    and `anyOf`/`oneOf` branches where they agree), or None where it declares none."""
    node = resolve(schema)
    if not isinstance(node, Mapping) or id(node) in path:  # a schema that holds itself: once
        return None
    path = (*path, id(node))

    def each(kinds: tuple[str, ...]) -> list[Default]:
        return [
            found
            for kind in kinds
            for part in node.get(kind, ())
            if (found := declared(part, resolve, path)) is not None
        ]

    parts, branches = each(("allOf",)), each(("anyOf", "oneOf"))
    value = node.get("default", NO_DEFAULT)
    if value is NO_DEFAULT:  # an allOf part's, else the one the branches that declare one agree on
        values = [p.value for p in parts if p.value is not NO_DEFAULT]
        if not values:
            values = [b.value for b in branches if b.value is not NO_DEFAULT]
        if values and all(same_json(v, values[0]) for v in values):
            value = values[0]
    members: dict[str, Default] = {}
    for name, member in (node.get("properties") or {}).items():
        if (found := declared(member, resolve, path)) is not None:
            members[name] = found
    conflicting: set[str] = set()
    for part in (*parts, *branches):  # a member they declare alike; one they differ on: none
        for name, member in part.members.items():
            if members.setdefault(name, member) != member:
                conflicting.add(name)
    for name in conflicting:
        del members[name]
    if value is NO_DEFAULT and not members:
        return None
    return Default(value, members)


def field_defaults(properties: Mapping[str, Any], resolve: Resolve) -> dict[str, Default]:
    """A body's fields (name → schema) that declare a default, themselves or in their members."""
    return {
        name: found for name, schema in properties.items() if (found := declared(schema, resolve)) is not None
    }


def defaulted(
    defaults: Mapping[str, Default], body: Mapping[str, Any], canonical: Mapping[str, str]
) -> frozenset[str]:
    """The canonical parameters `body` sets only to their declared defaults. `canonical` maps the
    body's fields that carry a parameter to its canonical name; where two fields carry one, each
    that is sent must be at its default."""
    if not defaults:
        return frozenset()
    at: set[str] = set()
    away: set[str] = set()
    for name, value in body.items():
        parameter = canonical.get(name)
        if parameter is None or value is None:
            continue
        default = defaults.get(name)
        (at if default is not None and default.holds(value) else away).add(parameter)
    return frozenset(at - away)
