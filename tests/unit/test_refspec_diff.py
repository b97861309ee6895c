"""What changed between two versions of a vendor's document (gateway/tools/refspec_diff.py), and
`scripts/fetch-refspecs --update`, which prints it for each vendor's newest document and moves
the pins. Offline: the documents are local (the pinned OpenAI document and a changed copy, small
documents written here), and the network is a fake `fetch`."""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.tools.refspec_diff import Change, changes, chat_fields
from gateway.tools.vendor_specs import read_document
from tests.integration.test_refspecs import load_script

fetch_refspecs = load_script()


def openapi(request: dict[str, Any], response: dict[str, Any] | None = None) -> dict[str, Any]:
    """A small OpenAPI 3.1 document with one chat operation."""
    return {
        "openapi": "3.1.0",
        "paths": {
            "/chat/completions": {
                "post": {
                    "requestBody": {
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Req"}}}
                    },
                    "responses": {
                        "200": {"content": {"application/json": {"schema": response or {"type": "object"}}}}
                    },
                }
            }
        },
        "components": {"schemas": {"Req": request}},
    }


REQUEST = {
    "type": "object",
    "properties": {
        "model": {"type": "string"},
        "n": {"type": "integer"},
        "effort": {"type": "string", "enum": ["low", "high"]},
        "messages": {"type": "array", "items": {"$ref": "#/components/schemas/Message"}},
    },
}


def test_fields_follow_refs_items_and_combinators():
    document = openapi(REQUEST)
    document["components"]["schemas"]["Message"] = {
        "oneOf": [
            {"type": "object", "properties": {"role": {"const": "user"}, "content": {"type": "string"}}},
            {
                "type": "object",
                "properties": {"role": {"const": "tool"}},
                "allOf": [{"$ref": "#/components/schemas/Message"}],
            },
        ]
    }
    fields = chat_fields(document)
    assert fields["request.messages[].role"].values == {'"user"', '"tool"'}
    assert fields["request.messages[].content"].types == {"string"}
    assert fields["request.effort"].description() == 'string; enum: "high", "low"'
    assert "response" in fields


def test_added_removed_retyped_and_values():
    old = openapi(REQUEST)
    old["components"]["schemas"]["Message"] = {"type": "object"}
    new = copy.deepcopy(old)
    properties = new["components"]["schemas"]["Req"]["properties"]
    properties["verbosity"] = {"type": "string", "enum": ["low"]}
    del properties["model"]
    properties["n"] = {"type": ["integer", "null"]}
    properties["effort"]["enum"] = ["low", "high", "xhigh"]
    assert changes(old, new) == [
        Change("values", "request.effort", '+ "xhigh"'),
        Change("removed", "request.model", "string"),
        Change("retyped", "request.n", "integer → integer, null"),
        Change("added", "request.verbosity", 'string; enum: "low"'),
    ]
    assert changes(old, copy.deepcopy(old)) == []


def test_swagger_polymorphism_is_the_union_of_its_subtypes():
    """Azure's Swagger 2.0: a base with `discriminator`, subtypes extending it with allOf."""
    base = {"type": "object", "discriminator": "role", "properties": {"role": {"type": "string"}}}
    user = {
        "allOf": [{"$ref": "#/definitions/Message"}],
        "properties": {"content": {"type": "string"}},
        "x-ms-discriminator-value": "user",
    }
    document = {
        "swagger": "2.0",
        "paths": {
            "/chat/completions": {
                "post": {
                    "parameters": [{"in": "body", "name": "body", "schema": {"$ref": "#/definitions/Req"}}],
                    "responses": {
                        "200": {"schema": {"type": "object", "properties": {"id": {"type": "string"}}}}
                    },
                }
            }
        },
        "definitions": {
            "Req": {
                "properties": {"messages": {"type": "array", "items": {"$ref": "#/definitions/Message"}}}
            },
            "Message": base,
            "UserMessage": user,
        },
    }
    fields = chat_fields(document)
    assert fields["request.messages[].content"].types == {"string"}
    assert fields["response.id"].types == {"string"}


def test_a_document_without_a_chat_operation_is_a_value_error():
    with pytest.raises(ValueError):
        chat_fields({"openapi": "3.1.0", "paths": {"/embeddings": {"post": {}}}})


@pytest.fixture(scope="module")
def openai_document(refspecs: Path) -> dict[str, Any]:
    return read_document(refspecs / "openai-openapi.yaml")


def changed_openai(document: dict[str, Any]) -> dict[str, Any]:
    """The pinned OpenAI document as a newer one might be: a field added, one removed, one
    retyped, an enum value added."""
    new = copy.deepcopy(document)
    request = new["components"]["schemas"]["CreateChatCompletionRequest"]["allOf"][1]["properties"]
    request["thinking_budget"] = {"type": "integer", "minimum": 0}
    del request["web_search_options"]
    request["seed"] = {"type": "string"}
    new["components"]["schemas"]["ReasoningEffort"]["anyOf"][0]["enum"].append("extreme")
    return new


def test_the_pinned_openai_document_against_a_changed_copy(openai_document: dict[str, Any]):
    found = changes(openai_document, changed_openai(openai_document))
    lines = [change.line() for change in found]
    assert "added    request.thinking_budget: integer" in lines
    assert "retyped  request.seed: integer, null → string" in lines
    assert any(line.startswith("removed  request.web_search_options:") for line in lines)
    assert any(line.startswith("removed  request.web_search_options.user_location") for line in lines)
    assert 'values   request.reasoning_effort: + "extreme"' in lines
    assert {change.path.split(".")[1].split("[")[0] for change in found} == {
        "thinking_budget",
        "seed",
        "web_search_options",
        "reasoning_effort",
    }


# ----- fetch-refspecs --update, with a fake network ---------------------------------------------

OLD_COMMIT, NEW_COMMIT = "a" * 40, "b" * 40


def lock_with(path: str, data: bytes, tmp_path: Path) -> Path:
    lock = tmp_path / "refspecs.lock.yaml"
    lock.write_text(
        "# a comment that stays\n"
        "files:\n"
        f"  - path: {path}\n"
        "    repo: vendor/api\n"
        f"    commit: {OLD_COMMIT}   # the old note\n"
        "    source: openapi.json\n"
        f"    bytes: {len(data)}\n"
        f"    sha256: {hashlib.sha256(data).hexdigest()}\n"
        "  - path: other.json\n"
        "    repo: vendor/other\n"
        f"    commit: {OLD_COMMIT}\n"
        "    source: other.json\n"
        "    bytes: 2\n"
        "    sha256: 44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a\n"
    )
    return lock


def fake_network(newest: dict[str, str], files: dict[str, bytes]):
    def fetch(url: str, limit: int) -> bytes:
        if url.startswith("https://api.github.com/repos/"):
            repo = url.removeprefix("https://api.github.com/repos/").split("/commits")[0]
            return json.dumps(
                [{"sha": newest[repo], "commit": {"committer": {"date": "2026-11-01T00:00:00Z"}}}]
            ).encode()
        commit = url.split("/")[5]
        return files[commit]

    return fetch


def test_update_prints_what_changed_and_writes_only_when_asked(tmp_path: Path):
    old = openapi(REQUEST)
    old["components"]["schemas"]["Message"] = {"type": "object"}
    new = copy.deepcopy(old)
    new["components"]["schemas"]["Req"]["properties"]["verbosity"] = {"type": "string"}
    old_bytes, new_bytes = json.dumps(old).encode(), json.dumps(new).encode()
    lock = lock_with("vendor.json", old_bytes, tmp_path)
    dest = tmp_path / "refspecs"
    fetch = fake_network(
        {"vendor/api": NEW_COMMIT, "vendor/other": OLD_COMMIT}, {OLD_COMMIT: old_bytes, NEW_COMMIT: new_bytes}
    )
    said: list[str] = []
    pins = fetch_refspecs.load_pins(lock)
    assert fetch_refspecs.update(pins, dest, lock, fetch=fetch, say=said.append) == []
    report = "\n".join(said)
    assert "newer    vendor.json: aaaaaaaaaaaa → bbbbbbbbbbbb (2026-11-01T00:00:00Z)" in report
    assert "added    request.verbosity: string" in report
    assert "current  other.json" in report
    assert OLD_COMMIT in lock.read_text() and not dest.exists()  # nothing written without --write

    assert fetch_refspecs.update(pins, dest, lock, write=True, fetch=fetch, say=said.append) == []
    moved = {pin.path: pin for pin in fetch_refspecs.load_pins(lock)}
    assert moved["vendor.json"].commit == NEW_COMMIT
    assert moved["vendor.json"].bytes == len(new_bytes)
    assert moved["vendor.json"].sha256 == hashlib.sha256(new_bytes).hexdigest()
    assert moved["other.json"] == pins[1]
    assert (dest / "vendor.json").read_bytes() == new_bytes
    text = lock.read_text()
    assert text.startswith("# a comment that stays\n")
    assert "the newest commit touching the source (fetch-refspecs --update)" in text
    assert yaml.safe_load(text)["files"][0]["source"] == "openapi.json"


def test_update_names_a_source_it_cannot_reach(tmp_path: Path):
    lock = lock_with("vendor.json", b"{}", tmp_path)

    def offline(url: str, limit: int) -> bytes:
        raise fetch_refspecs.Problem(f"cannot download {url}: no network")

    problems = fetch_refspecs.update(fetch_refspecs.load_pins(lock), tmp_path, lock, fetch=offline, say=print)
    assert len(problems) == 2 and all("no network" in line for line in problems)
