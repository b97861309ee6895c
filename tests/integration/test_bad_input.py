"""Bad input gets a 4xx in the dialect's own error shape (as its document says), never a 500."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import orjson
import pytest

from tests.support.dialect_routes import ChatRoute, chat_routes
from tests.support.documents import response_errors
from tests.support.readers import reader


def row(route: ChatRoute) -> tuple[str, str, str, dict[str, Any]]:
    """The dialect document, the path in it, the URL on the default mounts, a minimal valid body."""
    return (route.document, route.doc_path, route.url, route.body("hi", "m"))


CHAT_ROUTES = [row(route) for route in chat_routes()]
# the routes whose bodies are OpenAI's chat request, which SPEC_VIOLATIONS break
CHAT_SHAPED_ROUTES = [row(route) for route in chat_routes() if reader(route.dialect).chat_shaped]
USER = [{"role": "user", "content": "hi"}]

BAD_BODIES = {
    "not json": (b"{this is not json", "application/json", 400),
    "not utf-8": (b'{"messages": "\xff\xfe"}', "application/json", 400),
    "empty": (b"", "application/json", 400),
    "json array": (b"[1, 2]", "application/json", 400),
    "wrong content type": (b"hello", "text/plain", 415),
}


@pytest.mark.parametrize("route", CHAT_ROUTES, ids=lambda r: r[2])
@pytest.mark.parametrize("case", BAD_BODIES, ids=str)
def test_unreadable_bodies(gateway_url: str, route, case: str):
    spec_file, doc_path, url_path, _ = route
    raw, content_type, status = BAD_BODIES[case]
    response = httpx.post(f"{gateway_url}{url_path}", content=raw, headers={"content-type": content_type})
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    assert response.headers["x-request-id"]
    assert response_errors(spec_file, doc_path, "post", status, response.json()) == []


@pytest.mark.parametrize("route", CHAT_ROUTES, ids=lambda r: r[2])
def test_body_without_content_type_is_read_as_json(gateway_url: str, route):
    """Clients such as wrk or a bare socket may leave the header out; the body is still JSON."""
    _, _, url_path, minimal = route
    body = orjson.dumps(minimal)
    request = httpx.Request("POST", f"{gateway_url}{url_path}", content=body)
    assert "content-type" not in request.headers
    with httpx.Client() as client:
        response = client.send(request)
    assert response.status_code == 200, response.text


SPEC_VIOLATIONS = {
    "messages missing": {},
    "role unknown": {"messages": [{"role": "wizard", "content": "hi"}]},
    # (negative: every document's temperature is non-negative; Azure's has no maximum, the seed
    # leaves that to the model, with 422)
    "temperature negative": {"messages": USER, "temperature": -1},
    "n zero": {"messages": USER, "n": 0},
    "top_logprobs 21": {"messages": USER, "logprobs": True, "top_logprobs": 21},
    "stream not boolean": {"messages": USER, "stream": "yes"},
}


@pytest.mark.parametrize("route", CHAT_SHAPED_ROUTES, ids=lambda r: r[2])
@pytest.mark.parametrize("case", SPEC_VIOLATIONS, ids=str)
def test_spec_violations(gateway_url: str, route, case: str):
    spec_file, doc_path, url_path, minimal = route
    body = {key: value for key, value in minimal.items() if key != "messages"} | SPEC_VIOLATIONS[case]
    response = httpx.post(f"{gateway_url}{url_path}", json=body)
    assert 400 <= response.status_code < 500, response.text
    assert response_errors(spec_file, doc_path, "post", response.status_code, response.json()) == []


def test_too_many_stop_sequences_in_openai(gateway_url: str):
    response = httpx.post(
        f"{gateway_url}/v1/chat/completions",
        json={"model": "m", "messages": USER, "stop": ["a", "b", "c", "d", "e"]},
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "stop" and error["type"] == "invalid_request_error"


def test_unknown_route_is_404_in_shape(gateway_url: str):
    response = httpx.get(f"{gateway_url}/v1/nothing-here")
    assert response.status_code == 404
    assert response.json()["error"]["code"]


def test_request_id_is_echoed(gateway_url: str):
    response = httpx.post(
        f"{gateway_url}/v1/chat/completions",
        headers={"x-request-id": "trace-123"},
        json={"model": "m", "messages": USER},
    )
    assert response.headers["x-request-id"] == "trace-123"
    fresh = httpx.post(f"{gateway_url}/v1/chat/completions", json={"model": "m", "messages": USER})
    assert uuid.UUID(fresh.headers["x-request-id"]).version == 4  # the gateway's own: a UUID
