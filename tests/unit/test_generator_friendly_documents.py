"""The documents keep the shapes every mainstream client generator takes on default settings
(tests/system/test_generated_clients.py runs the generators), and those shapes validate as
before: null where null was admitted, defaults still declared, security optional on an open
gateway without opening a keyed one."""

from __future__ import annotations

from typing import Any

import jsonschema_rs
import pytest

from gateway.config.settings import Key
from gateway.dialects.registry import DIALECTS
from gateway.http.documents import load_document, resolve
from gateway.http.served_documents import HTTP_METHODS, served_document
from gateway.http.validation import compile_schema
from gateway.policy.auth import KeyStore, Unauthorized, authenticate, new_key, schemes_of

DOCUMENTS = sorted({dialect.document for dialect in DIALECTS.values()})


def walk(node: Any, path: tuple[str, ...] = ()) -> Any:
    """Every (path, schema-ish dict) of a document."""
    if isinstance(node, dict):
        yield path, node
        for key, value in node.items():
            yield from walk(value, (*path, str(key)))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from walk(value, (*path, str(index)))


def request_schemas(document: dict[str, Any]) -> list[str]:
    """The component schemas a request body reaches."""
    schemas = document["components"]["schemas"]
    seen: list[str] = []

    def reach(node: Any) -> None:
        for _path, found in walk(node):
            if "$ref" in found and found["$ref"].startswith("#/components/schemas/"):
                name = found["$ref"].rsplit("/", 1)[-1]
                if name not in seen:
                    seen.append(name)
                    reach(schemas[name])

    for item in document["paths"].values():
        for method in HTTP_METHODS:
            if "requestBody" in item.get(method, {}):
                reach(item[method]["requestBody"])
    return seen


@pytest.mark.parametrize("name", DOCUMENTS)
def test_no_schema_is_null_alone(name: str):
    """A component whose only value is null (`enum: [null]`) makes openapi-generator's Python
    output a syntax error (`class NullValue(, Enum):`)."""
    schemas = load_document(name)["components"]["schemas"]
    assert [n for n, schema in schemas.items() if schema.get("enum") == [None]] == []


@pytest.mark.parametrize("name", DOCUMENTS)
def test_request_defaults_are_declared_in_named_schemas(name: str):
    """openapi-typescript (default `defaultNonNullable`) makes a property with a `default` of its
    own required in any schema under components; a `$ref` to a schema that declares the default
    keeps the field optional, and the default stays in the document for users and tools."""
    document = load_document(name)
    schemas = document["components"]["schemas"]
    inline, declared = [], 0
    for schema_name in request_schemas(document):
        for path, node in walk(schemas[schema_name]):
            for field, value in (node.get("properties") or {}).items():
                if isinstance(value, dict) and "default" in value:
                    inline.append(".".join((schema_name, *path, field)))
                declared += "default" in resolve(document, value) if isinstance(value, dict) else 0
    assert inline == []
    if name != "anthropic.yaml":  # Anthropic's request declares no defaults
        assert declared > 0


@pytest.mark.parametrize("name", DOCUMENTS)
def test_text_or_parts_unions_are_any_of(name: str):
    """typescript-fetch cannot compile a `oneOf` whose array branch holds a `oneOf` (it calls an
    `instanceOf…` the item's union does not have); the two branches are disjoint JSON types, so
    `anyOf` admits exactly the same values."""
    document = load_document(name)
    found = []
    for path, node in walk(document):
        for branch in node.get("oneOf", []) if isinstance(node.get("oneOf"), list) else []:
            branch = resolve(document, branch)
            items = resolve(document, branch.get("items", {})) if branch.get("type") == "array" else {}
            if "oneOf" in items or "anyOf" in items:
                found.append("/".join(path))
    assert found == []


AZURE = load_document("azure.yaml")
USAGE = {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}
CHUNK = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": []}


@pytest.mark.parametrize(
    ("schema", "value", "valid"),
    [
        ("ChatResponseMessage", {"role": "assistant", "content": None}, True),
        ("ChatResponseMessage", {"role": "assistant", "content": "hi"}, True),
        ("ChatResponseMessage", {"role": "assistant", "content": 5}, False),
        ("ChatResponseMessage", {"role": "assistant"}, False),
        ("StreamingChatCompletionsUpdate", {"usage": None}, True),
        (
            "StreamingChatCompletionsUpdate",
            {"usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}},
            True,
        ),
        ("StreamingChatCompletionsUpdate", {"usage": "none"}, False),
        ("StreamingChatCompletionsUpdate", {"usage": {"prompt_tokens": 1}}, False),
    ],
)
def test_null_is_admitted_where_it_was(schema: str, value: dict[str, Any], valid: bool):
    """Azure's nullable fields, once a named null schema, admit null and refuse what they refused."""
    if schema == "StreamingChatCompletionsUpdate":
        value = {
            "id": "c",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "m",
            "choices": [],
            **value,
        }
    validator = compile_schema({"$ref": f"#/components/schemas/{schema}"}, AZURE["components"])
    assert validator.is_valid(value) is valid, value


def test_text_or_parts_still_refuses_what_it_refused():
    validator = compile_schema({"$ref": "#/components/schemas/ChatRequestUserMessage"}, AZURE["components"])
    assert validator.is_valid({"role": "user", "content": "hi"})
    assert validator.is_valid({"role": "user", "content": [{"type": "text", "text": "hi"}]})
    for content in (5, None, [{"type": "nope"}], {"type": "text", "text": "hi"}):
        with pytest.raises(jsonschema_rs.ValidationError):
            validator.validate({"role": "user", "content": content})


@pytest.mark.parametrize("name", DOCUMENTS)
def test_an_open_gateway_declares_its_schemes_optional(name: str):
    document = load_document(name)
    assert served_document(document, "/m", keys_enforced=True)["security"] == document["security"]
    served = served_document(document, "/m", keys_enforced=False)["security"]
    assert served == [*document["security"], {}]


@pytest.mark.parametrize("name", DOCUMENTS)
def test_optional_security_does_not_open_a_keyed_gateway(name: str):
    """The front door reads the schemes of a document; `{}` among them names none, so a keyed
    gateway stays keyed and an open one stays open."""
    key, sha = new_key()
    keyed, open_ = KeyStore([Key(name="k", sha256=sha)]), KeyStore([])
    served = served_document(load_document(name), "/m", keys_enforced=False)
    operations = [
        item[method] for item in served["paths"].values() for method in HTTP_METHODS if method in item
    ]
    guarded = [op for op in operations if op.get("security", served["security"])]
    assert guarded
    for operation in guarded:
        schemes = schemes_of(served, operation)
        assert schemes
        with pytest.raises(Unauthorized):
            authenticate(keyed, schemes, {})
        header = schemes[0].header
        presented = f"Bearer {key}" if schemes[0].bearer else key
        assert authenticate(keyed, schemes, {header: presented}).key is not None
        assert authenticate(open_, schemes, {}).key is None
