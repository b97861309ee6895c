"""How a request body is read before its schema (gateway/http/validation.py's parse_json).

A body that gives a key twice in one object is refused, naming the key (orjson would keep the
last silently, while a proxy in front may have read the first). jiter finds the repeat; the
standard library's decoder, which the check used alone before, is the reference: the two must
agree on every body, hostile ones included. A body nested deeper than 64 levels is refused; the
level-by-level walk must agree with the plain recursive definition of depth."""

from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.errors import BadRequest
from gateway.http.validation import (
    KEY_CHECKER,
    MAX_DEPTH,
    DuplicateKey,
    deeper_than,
    parse_json,
    repeated_key,
)


def reference(raw: bytes) -> str | None:
    """What the standard library's decoder alone says (the check before jiter)."""
    try:
        KEY_CHECKER.decode(raw.decode("utf-8"))
    except DuplicateKey as duplicate:
        return str(duplicate)
    return None


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        (b'{"model": "a", "messages": [], "model": "b"}', "model"),
        (b'{"a": 1, "\\u0061": 2}', "a"),  # the same key, escaped
        (b'{"\\u00e9": 1, "\xc3\xa9": 2}', "\u00e9"),  # escaped and as UTF-8
        (b'{"messages": [{"role": "user", "content": "x", "role": "assistant"}]}', "role"),
        (b'{"x": {"y": {"z": [1, {"k": 1, "k": 1}]}}}', "k"),
        (b'{"": 1, "": 2}', ""),
        (b'{"a": {"b": 1}, "c": [{"b": 1}, {"b": 2}]}', None),  # the same key in different objects
        (b'{"a": "\\"a\\": 1, \\"a\\": 2"}', None),  # only in a string
        (b'{"A": 1, "a": 2}', None),  # keys are case-sensitive
        (b'[{"a": 1}, {"a": 1}]', None),
    ],
)
def test_a_key_given_twice_in_one_object_is_found(raw: bytes, key: str | None) -> None:
    assert repeated_key(raw) == key == reference(raw)


def test_the_refusal_names_the_key() -> None:
    with pytest.raises(BadRequest, match="gives the key 'role' twice in one object") as raised:
        parse_json(b'{"messages": [{"role": "user", "role": "user", "content": "x"}]}')
    assert raised.value.param == "role"


def test_a_body_jiter_alone_refuses_is_read_as_the_standard_library_reads_it(monkeypatch) -> None:
    """The standard library decides whenever jiter refuses: a refusal for another reason than a
    repeat (none is known of a body orjson reads) loses nothing."""

    def refuses(*args, **kwargs):
        raise ValueError("some other complaint")

    monkeypatch.setattr("gateway.http.validation.jiter.from_json", refuses)
    assert repeated_key(b'{"a": 1, "b": 2}') is None
    assert repeated_key(b'{"a": 1, "a": 2}') == "a"


KEYS = st.sampled_from(["a", "b", "A", "\u00e9", "\u0000", "", "role", '"', "\\", "\U0001f600"])
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.lists(st.tuples(KEYS, inner), max_size=4),
    max_leaves=20,
)


def encoded(value: object, escape: bool) -> str:
    """JSON text of `value`, where a list of (key, value) pairs is an object that may repeat a
    key; `escape` writes keys with \\u escapes."""
    if isinstance(value, list) and value and all(isinstance(item, tuple) for item in value):
        pairs = (f"{json.dumps(k, ensure_ascii=escape)}: {encoded(v, escape)}" for k, v in value)
        return "{" + ", ".join(pairs) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(encoded(item, escape) for item in value) + "]"
    return json.dumps(value, ensure_ascii=escape)


@settings(max_examples=300, deadline=None)
@given(VALUES, st.booleans())
def test_jiter_and_the_standard_library_agree(value: object, escape: bool) -> None:
    raw = encoded(value, escape).encode()
    orjson.loads(raw)  # a body the check sees is one orjson read
    assert repeated_key(raw) == reference(raw)


def depth(value: object) -> int:
    """Levels of objects and arrays, by the definition (recursive: these values are small)."""
    if isinstance(value, dict):
        return 1 + max(map(depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(depth, value), default=0)
    return 0


def nested(levels: int) -> object:
    """`levels` levels of objects and arrays by turns, with shallower containers beside them."""
    value: object = "bottom"
    for level in range(levels):
        value = [value, 1] if level == 0 else {"x": value, "y": []} if level % 2 else [0, value, {}]
    return value


@pytest.mark.parametrize("levels", [1, 2, MAX_DEPTH - 1, MAX_DEPTH, MAX_DEPTH + 1, 250])
def test_a_body_is_refused_only_past_the_depth_limit(levels: int) -> None:
    body = {"model": "m", "deep": nested(levels - 1)}
    assert depth(body) == levels
    raw = orjson.dumps(body)
    assert deeper_than(orjson.loads(raw), MAX_DEPTH) is (levels > MAX_DEPTH)
    if levels > MAX_DEPTH:
        with pytest.raises(BadRequest, match=f"deeper than {MAX_DEPTH} levels"):
            parse_json(raw)
    else:
        assert parse_json(raw) == body


CONTAINERS = st.recursive(
    st.none() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=2), inner, max_size=4),
    max_leaves=60,
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(CONTAINERS, max_size=4) | st.dictionaries(st.text(max_size=2), CONTAINERS, max_size=4),
    st.integers(1, 12),
)
def test_the_walk_agrees_with_the_definition_of_depth(value: object, limit: int) -> None:
    assert deeper_than(orjson.loads(orjson.dumps(value)), limit) is (depth(value) > limit)
