"""The rules a dialect's document states between fields, which an OpenAPI 3.0 schema cannot say
(`top_logprobs` needs `logprobs: true`, `n` at most `best_of`, keys of a map …).

Each rule is written once, as data, in the document: the chat request schema's
`x-chatgate-rules` list (openapi/README.md). The translator refuses a body that breaks one with
400 (gateway/dialects/shape.py), and `chatgate conformance` judges generated bodies by the same
rules (gateway/tools/conformance.py). A rule is broken when every condition holds:

- `when`: parameter → a JSON Schema (2020-12) its value matches; an absent parameter is null;
- `greater: [a, b]`: a's value is greater than b's, each absent or null one read as its
  documented `default`;
- `each: <array parameter>`: the conditions are about each item of that array (a message …);
- `among: {name: <dotted path>, in: <array parameter>, at: <dotted path>}`: the name at `name`
  is a string that no item of the array holds at `at` (a named `tool_choice` that is not one
  of `tools`); `{name}` in the message is that name.

`message` may name parameters in braces (`{n}`): their values, or defaults, are filled in.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import jsonschema_rs

from gateway.core.errors import BadRequest

EXTENSION = "x-chatgate-rules"


@dataclass(frozen=True, slots=True)
class Rule:
    name: str
    message: str
    param: str  # the parameter the error names
    when: tuple[tuple[str, Any], ...] = ()  # (parameter, compiled validator)
    greater: tuple[str, str] | None = None
    each: str | None = None
    among: tuple[str, str, str] | None = None  # (name's path, array parameter, path in an item)
    defaults: Mapping[str, Any] = field(default_factory=dict)
    # parameters the rule cannot be broken without (`gates`): a body that lacks one keeps it
    gates: tuple[str, ...] = ()

    def holds_for(self, values: Mapping[str, Any]) -> bool:
        """Whether `values` (a body, or one item of `each`) keeps the rule."""
        for name, validator in self.when:
            if not validator.is_valid(values.get(name)):
                return True
        if self.greater is not None:
            first, second = (self.value(values, name) for name in self.greater)
            numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (first, second))
            if not numbers or not first > second:
                return True
        return self.among is not None and missing_name(self.among, values) is None

    def value(self, values: Mapping[str, Any], name: str) -> Any:
        found = values.get(name)
        return self.defaults.get(name) if found is None else found

    def breaches(self, body: Mapping[str, Any]) -> Iterator[BadRequest]:
        """The errors this body's breaches of the rule are answered with (none when it keeps it)."""
        if self.each is None:
            if not self.holds_for(body):
                yield self.error(body, ["body", self.param], self.param)
            return
        items = body.get(self.each)
        # an item that fails the first `when` keeps the rule: most do (a conversation's every
        # message is read, and most are not the assistant's), so that is asked here, inline
        first, kept = self.when[0] if self.when else (None, None)
        for index, item in enumerate(items if isinstance(items, list) else ()):
            if type(item) is not dict and not isinstance(item, Mapping):
                continue
            if kept is not None and not kept.is_valid(item.get(first)):
                continue
            if not self.holds_for(item):
                where = f"{self.each}[{index}]"
                yield self.error(item, ["body", self.each, index], where, in_item=True)

    def error(
        self, values: Mapping[str, Any], loc: list[str | int], param: str, in_item: bool = False
    ) -> BadRequest:
        shown = {name: self.value(values, name) for name in self.named()}
        if self.among is not None:
            shown["name"] = missing_name(self.among, values)
        message = self.message.format_map(_Shown(shown))
        if in_item:
            message = f"{param}: {message}"
        return BadRequest(
            message,
            param=param,
            loc=loc,
            value=values if in_item else values.get(self.param),
            code="BadRequest",
        )

    def named(self) -> set[str]:
        names = {name for name, _ in self.when} | set(self.greater or ())
        return names | {self.param}


def missing_name(among: tuple[str, str, str], values: Mapping[str, Any]) -> str | None:
    """The name `among` looks for, when it is a string no item of the array holds."""
    path, array, at = among
    name = dig(values, path)
    items = values.get(array)
    held = {dig(item, at) for item in items} if isinstance(items, list) else set()
    return name if isinstance(name, str) and name not in held else None


def dig(value: Any, path: str) -> Any:
    """The value at a dotted path (`function.name`), or None where the path does not lead."""
    for key in path.split("."):
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


class _Shown(dict[str, Any]):
    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


def read_rules(schema: Mapping[str, Any], defaults: Mapping[str, Any]) -> tuple[Rule, ...]:
    """The rules of a request schema's `x-chatgate-rules`, compiled."""
    rules = []
    for raw in schema.get(EXTENSION, ()):
        when = tuple(
            (name, jsonschema_rs.Draft202012Validator(condition))
            for name, condition in (raw.get("when") or {}).items()
        )
        greater = raw.get("greater")
        among = raw.get("among")
        rules.append(
            Rule(
                name=raw["name"],
                message=raw["message"],
                param=raw["param"],
                when=when,
                greater=(greater[0], greater[1]) if greater else None,
                each=raw.get("each"),
                among=(among["name"], among["in"], among["at"]) if among else None,
                defaults=dict(defaults),
            )
        )
    return tuple(replace(rule, gates=gates(rule)) for rule in rules)


def gates(rule: Rule) -> tuple[str, ...]:
    """The body's parameters without which `rule` holds: its `each` array (no items, nothing to
    break); a `when` parameter whose condition null does not match (absent reads as null); the
    parameter an `among` name is found in (no name, none missing). Most bodies lack most of
    them, so most rules are passed over with a key looked up (gateway/dialects/shape.py asks
    every request)."""
    if rule.each is not None:
        return (rule.each,)
    found = [name for name, validator in rule.when if not validator.is_valid(None)]
    if rule.among is not None:
        found.append(rule.among[0].split(".", 1)[0])
    return tuple(dict.fromkeys(found))


def first_breach(rules: tuple[Rule, ...], body: Mapping[str, Any]) -> BadRequest | None:
    """The error for the first rule the body breaks, or None."""
    for rule in rules:
        for name in rule.gates:
            if name not in body:
                break  # the rule holds
        else:
            for error in rule.breaches(body):
                return error
    return None
