"""Property-based: whatever a client adds that its dialect's document does not define — any JSON
type, any depth, under any extra-parameters policy, names the other dialects use included — the
answer is a success or a 4xx in the dialect's own error shape, never a 5xx. (The audit found 134
such 500s in 456 probes: undefined fields were read as if defined, before the policy saw them.)"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.app import create_app
from gateway.config.settings import Settings
from gateway.core.parameters import BY_SPELLING
from gateway.dialects.registry import DIALECTS
from gateway.http.documents import DialectSpec, load_document
from tests.support.dialect_routes import ChatRoute, chat_routes
from tests.support.documents import response_errors

pytestmark = pytest.mark.slow  # out of the fast lane (docs/development/tests.md)

APP = create_app(Settings())
EXAMPLES = settings(
    max_examples=150, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck)
)
POLICIES = ("error", "drop", "pass-through")

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=30,
)


def nested(depth: int, leaf: Any) -> Any:
    for level in range(depth):
        leaf = [leaf] if level % 2 else {"n": leaf}
    return leaf


deep_values = st.builds(nested, st.integers(min_value=1, max_value=300), scalars)


def undefined_names(route: ChatRoute) -> list[str]:
    """Every parameter some dialect defines that this one does not, and a name nobody uses."""
    dialect = DIALECTS[route.dialect]
    defined = DialectSpec(load_document(dialect.document), frozenset(dialect.chat_operations)).chat_fields
    return [*sorted(set(BY_SPELLING) - defined), "not_a_parameter"]


def post(route: ChatRoute, body: dict[str, Any], policy: str) -> httpx.Response:
    async def send() -> httpx.Response:
        transport = httpx.ASGITransport(app=APP)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            return await client.post(route.url, json=body, headers={"extra-parameters": policy})

    return asyncio.run(send())


@pytest.mark.parametrize("route", chat_routes(), ids=lambda r: r.url.split("?")[0])
def test_undefined_fields_never_give_a_5xx(route: ChatRoute):
    names = undefined_names(route)

    @given(
        extra=st.dictionaries(
            st.sampled_from(names), st.one_of(json_values, deep_values), min_size=1, max_size=4
        ),
        policy=st.sampled_from(POLICIES),
        stream=st.booleans(),
    )
    @EXAMPLES
    def check(extra: dict[str, Any], policy: str, stream: bool) -> None:
        body = {**route.body("Hello!"), **extra, "stream": stream}
        answer = post(route, body, policy)
        assert answer.status_code < 500, (answer.status_code, answer.text[:300], body)
        if answer.status_code >= 400:
            assert (
                response_errors(route.document, route.doc_path, "post", answer.status_code, answer.json())
                == []
            )

    check()


# names that some message or content part defines, undefined where they are sent here
MESSAGE_NAMES = ["tool_calls", "tool_call_id", "refusal", "audio", "function_call", "not_a_field"]
PART_NAMES = ["refusal", "image_url", "input_audio", "file", "content", "detail", "not_a_field"]


@pytest.mark.parametrize("route", chat_routes(), ids=lambda r: r.url.split("?")[0])
def test_undefined_fields_inside_messages_and_parts_never_give_a_5xx(route: ChatRoute):
    """The same inside the body: a message or a text part carrying fields that other message
    roles or part types define (the fuzz found a text part's `refusal: [true]` read as its text)."""

    @given(
        role=st.sampled_from(["system", "developer", "user"]),
        text=st.text(max_size=5),
        as_parts=st.booleans(),
        message_extra=st.dictionaries(st.sampled_from(MESSAGE_NAMES), json_values, max_size=2),
        part_extra=st.dictionaries(st.sampled_from(PART_NAMES), json_values, max_size=3),
        policy=st.sampled_from(POLICIES),
    )
    @EXAMPLES
    def check(
        role: str, text: str, as_parts: bool, message_extra: dict, part_extra: dict, policy: str
    ) -> None:
        content: Any = [{"type": "text", "text": text, **part_extra}] if as_parts else text
        body = route.body()
        body["messages"] = [{"role": role, "content": content, **message_extra}, *body["messages"]]
        answer = post(route, body, policy)
        assert answer.status_code < 500, (answer.status_code, answer.text[:300], body)

    check()


@pytest.mark.parametrize("route", chat_routes(), ids=lambda r: r.url.split("?")[0])
def test_a_text_part_is_read_by_its_text_alone(route: ChatRoute):
    """The fuzz case itself (issue 19's 10,000-case run): a text part whose undefined `refusal`
    is a list, its `text` empty."""
    body = route.body()
    body["messages"] = [
        {"role": "system", "content": [{"type": "text", "text": "", "refusal": [True, None]}]},
        *body["messages"],
    ]
    answer = post(route, body, "pass-through")
    assert answer.status_code < 500, answer.text
