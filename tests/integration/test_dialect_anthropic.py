"""The Anthropic Messages dialect at /anthropic on a running gateway (echo), every answer and every
stream event held to the vendor's own document (refspecs/anthropic/anthropic-messages-api.json:
`Message`, the `MessageStreamEvent` variants, `ErrorResponse`, `CountMessageTokensResponse`,
the models list): requests as Claude Code sends them (`?beta=true`, any `anthropic-version` and
`anthropic-beta`, `Accept: application/json` on a stream, a `system` message inside `messages`,
fields with no meaning here), content blocks read by their `type`, errors naming the field."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import httpx
import jsonschema_rs
import pytest

from backends.echo import PREFIX

VENDOR_DOCUMENT = "anthropic/anthropic-messages-api.json"
CLAUDE_CODE_HEADERS = {
    "anthropic-version": "2023-06-01",
    "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14,context-management-2025-06-27",
    "anthropic-dangerous-direct-browser-access": "true",
    "x-app": "cli",
    "accept": "application/json",  # even on streams
}
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@pytest.fixture(scope="module")
def url(gateway_url: str) -> str:
    return f"{gateway_url}/anthropic/v1"


@cache
def vendor_validator(refspecs: Path, schema: str) -> jsonschema_rs.Validator:
    document = json.loads((refspecs / VENDOR_DOCUMENT).read_text())
    return jsonschema_rs.Draft202012Validator(
        {"$ref": f"#/components/schemas/{schema}", "components": document["components"]},
        validate_formats=False,
    )


def vendor_errors(refspecs: Path, schema: str, body: Any) -> list[str]:
    validator = vendor_validator(refspecs, schema)
    return [f"{list(e.instance_path)}: {e.message}" for e in validator.iter_errors(body)]


def message(url: str, body: dict[str, Any], **headers: str) -> httpx.Response:
    return httpx.post(f"{url}/messages?beta=true", json=body, headers=headers, timeout=30)


def events(url: str, body: dict[str, Any], **headers: str) -> list[tuple[str, dict[str, Any]]]:
    """(event name, payload) of every event of a stream; each event has both lines."""
    with httpx.stream(
        "POST", f"{url}/messages?beta=true", json={**body, "stream": True}, headers=headers, timeout=30
    ) as answer:
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/event-stream")
        raw = answer.read().decode()
    found = []
    for block in raw.split("\n\n"):
        if block.strip():
            name, data = block.split("\n")
            assert name.startswith("event: ") and data.startswith("data: "), block
            found.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return found


def held_to_the_vendor(refspecs: Path, stream: list[tuple[str, dict[str, Any]]]) -> None:
    """Each event named by its type, valid for the vendor's MessageStreamEvent; every block
    started is stopped, in order; message_start first, message_delta and message_stop last."""
    for name, payload in stream:
        assert name == payload["type"]
        if name != "ping":
            assert vendor_errors(refspecs, "MessageStreamEvent", payload) == [], payload
    names = [name for name, _ in stream if name != "ping"]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    open_block = None
    for name, payload in stream:
        if name == "content_block_start":
            assert open_block is None
            open_block = payload["index"]
        elif name == "content_block_delta":
            assert payload["index"] == open_block
        elif name == "content_block_stop":
            assert payload["index"] == open_block
            open_block = None
    assert open_block is None


def test_a_message_as_the_vendor_shapes_it(url: str, refspecs: Path):
    answer = message(
        url, {"model": "echo", "max_tokens": 64, "messages": [{"role": "user", "content": "Hi"}]}
    )
    assert answer.status_code == 200
    body = answer.json()
    assert vendor_errors(refspecs, "Message", body) == []
    assert body["id"].startswith("msg_") and body["content"][0]["text"] == f"{PREFIX} Hi"
    assert (body["stop_reason"], body["stop_sequence"], body["stop_details"], body["container"]) == (
        "end_turn",
        None,
        None,
        None,
    )


def test_a_stream_as_the_vendor_shapes_it_decided_by_the_body(url: str, refspecs: Path):
    body = {
        "model": "claude-opus-5-5",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "Hi there"}],
    }
    stream = events(url, body, **CLAUDE_CODE_HEADERS)
    held_to_the_vendor(refspecs, stream)
    text = "".join(p["delta"]["text"] for name, p in stream if name == "content_block_delta")
    assert text == f"{PREFIX} Hi there"
    delta = stream[-2][1]
    assert delta["delta"]["stop_reason"] == "end_turn" and delta["usage"]["output_tokens"] > 0


def test_a_claude_code_turn(url: str, refspecs: Path):
    """Its body as the audit recorded it: system blocks with cache_control, a system message
    inside messages with its own output_config, thinking, context_management, a tool with
    defer_loading, metadata.user_id as a JSON string. Answered, the fields named as dropped."""
    body = {
        "model": "claude-opus-5-5",
        "max_tokens": 32000,
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.328"},
            {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
        ],
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": "say hi", "cache_control": {"type": "ephemeral"}}],
            },
            {"role": "system", "content": "Reminder.", "output_config": {"effort": "low"}},
        ],
        "tools": [WEATHER, {**WEATHER, "name": "deferred", "defer_loading": True}],
        "metadata": {"user_id": json.dumps({"device_id": "d", "session_id": "s"})},
        "thinking": {"type": "adaptive", "display": "updates"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "medium"},
    }
    answer = message(url, body, **CLAUDE_CODE_HEADERS)
    assert answer.status_code == 200, answer.text
    assert vendor_errors(refspecs, "Message", answer.json()) == []
    dropped = answer.headers["x-chatgate-dropped-params"].split(", ")
    assert {"thinking", "context_management", "output_config", "cache_control", "tools.defer_loading"} <= set(
        dropped
    )
    held_to_the_vendor(refspecs, events(url, body, **CLAUDE_CODE_HEADERS))


def test_a_forced_tool_call_whole_and_streamed(url: str, refspecs: Path):
    body = {
        "model": "echo",
        "max_tokens": 64,
        "tools": [WEATHER],
        "tool_choice": {"type": "tool", "name": "get_weather"},
        "messages": [{"role": "user", "content": "Oslo"}],
    }
    whole = message(url, body).json()
    assert vendor_errors(refspecs, "Message", whole) == []
    (call,) = whole["content"]
    assert (
        call["type"] == "tool_use" and call["id"].startswith("toolu_") and call["input"] == {"city": "Oslo"}
    )
    assert whole["stop_reason"] == "tool_use"
    stream = events(url, body)
    held_to_the_vendor(refspecs, stream)
    partial = [p["delta"]["partial_json"] for n, p in stream if n == "content_block_delta"]
    assert json.loads("".join(partial)) == {"city": "Oslo"}


def test_the_stop_sequence_that_matched(url: str, refspecs: Path):
    body = {
        "model": "echo",
        "max_tokens": 64,
        "stop_sequences": ["zzz", "said"],
        "messages": [{"role": "user", "content": "Hi"}],
    }
    whole = message(url, body).json()
    assert (whole["stop_reason"], whole["stop_sequence"]) == ("stop_sequence", "said")
    stream = events(url, body)
    held_to_the_vendor(refspecs, stream)
    assert stream[-2][1]["delta"]["stop_sequence"] == "said"


@pytest.mark.parametrize(
    ("body", "names"),
    [
        ({"model": "echo", "messages": [{"role": "user", "content": "Hi"}]}, "max_tokens: Field required"),
        (
            {
                "model": "echo",
                "max_tokens": 8,
                "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "video"}]}],
            },
            "messages.0.content.1.type: ",
        ),
        (
            {"model": "echo", "max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "text"}]}]},
            "messages.0.content.0.text: Field required",
        ),
        (
            {"model": "echo", "max_tokens": 8, "messages": [{"role": "bot", "content": "Hi"}]},
            "messages.0.role: ",
        ),
    ],
    ids=["max_tokens", "block type", "block field", "role"],
)
def test_a_400_in_the_vendors_shape_names_the_field(
    url: str, refspecs: Path, body: dict[str, Any], names: str
):
    answer = message(url, body)
    assert answer.status_code == 400
    said = answer.json()
    assert vendor_errors(refspecs, "ErrorResponse", said) == []
    assert said["error"]["type"] == "invalid_request_error" and said["error"]["message"].startswith(names)
    assert answer.headers["request-id"] == said["request_id"]


def test_count_tokens(url: str, refspecs: Path):
    messages = [{"role": "user", "content": "How many tokens is this prompt?"}]
    counted = []
    for extra in ({}, {"system": "Be brief."}, {"system": "Be brief.", "tools": [WEATHER]}):
        answer = httpx.post(
            f"{url}/messages/count_tokens?beta=true",
            json={"model": "echo", "messages": messages, **extra},
            timeout=30,
        )
        assert answer.status_code == 200
        assert vendor_errors(refspecs, "CountMessageTokensResponse", answer.json()) == []
        counted.append(answer.json()["input_tokens"])
    assert 0 < counted[0] < counted[1] < counted[2]


def test_the_models(url: str, refspecs: Path):
    listed = httpx.get(f"{url}/models?beta=true", timeout=30).json()
    assert vendor_errors(refspecs, "ListResponse_ModelInfo_", listed) == []
    assert "echo" in [model["id"] for model in listed["data"]]
    one = httpx.get(f"{url}/models/echo", timeout=30).json()
    assert vendor_errors(refspecs, "ModelInfo", one) == [] and one["id"] == "echo"


def test_an_unknown_path_is_a_404_in_its_shape(url: str, refspecs: Path):
    answer = httpx.post(f"{url}/complete", json={}, timeout=30)
    assert answer.status_code == 404
    assert vendor_errors(refspecs, "ErrorResponse", answer.json()) == []
