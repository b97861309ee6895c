"""What real model servers show chatgate getting wrong (issue 25): one test per defect, each
asserting the correct behaviour. They fail on today's chatgate and are meant to be merged together
with the fixes. The servers, fixtures and clients are those of tests/system/test_real_servers.py; each
test says the request that shows the defect and what chatgate answered when it was written.
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest

from tests.support.dialect_clients import DIALECTS, Choice, Dialect, DialectError
from tests.support.real_server_fixtures import (  # noqa: F401  (fixtures)
    DEPLOYMENT,
    FORCED_TOOL,
    GREEDY,
    MESSAGES,
    MODEL_SERVERS,
    TOOL,
    Upstream,
    dialects,
    direct_text,
    litellm_upstream,
    llama_cpp_upstream,
    model_dir,
    named_upstream,
    on,
    transformers_upstream,
)
from tests.support.real_servers import LITELLM_MOCK_TEXT

OPENAI = DIALECTS["openai"]
HEALTH_FAILURES = 3  # the default `health.failures`: failures in a row that eject a replica
LOGIT_BIAS = {"logit_bias": {"5": 10}}  # transformers serve: 500 (`sequence_bias` … floats)
JSON_SCHEMA = {"response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": {}}}}


@pytest.fixture
def upstream(request: pytest.FixtureRequest) -> Upstream:
    return named_upstream(request)


def server_error(upstream: Upstream, params: dict[str, Any]) -> str:
    """The server's own error text for a request it refuses with a 500 (checked: the finding is
    about what chatgate makes of exactly that)."""
    response = httpx.post(
        f"{upstream.server.base_url}/chat/completions",
        json={"model": upstream.server.model, **params},
        headers={"authorization": f"Bearer {upstream.server.api_key}"} if upstream.server.api_key else {},
        timeout=60,
    )
    assert response.status_code == 500, response.text
    return response.text


def strings(value: Any) -> list[str]:
    """Every string in a JSON value: what a client can read in an error body, whatever its shape."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    return [text for item in value for text in strings(item)] if isinstance(value, list) else []


def repeats(upstream_answer: str, client_body: Any) -> list[str]:
    """The lines of the upstream's error text (and any file path in it) that reach the client."""
    try:
        said_upstream = strings(json.loads(upstream_answer))
    except json.JSONDecodeError:
        said_upstream = [upstream_answer]
    lines = [line.strip() for text in said_upstream for line in text.splitlines() if len(line.strip()) >= 12]
    paths = re.findall(r"/[\w.-]+(?:/[\w.-]+)+\.py", upstream_answer)
    client_reads = "\n".join(strings(client_body))
    return [piece for piece in [*lines, *paths] if piece in client_reads]


def names(parameter: str, body: Any) -> bool:
    text = "\n".join(strings(body))
    return re.search(rf"(?<![\w-]){re.escape(parameter)}(?![\w-])", text) is not None


def ready(upstream: Upstream) -> dict[str, Any]:
    return httpx.get(f"{upstream.gateway}/ready", timeout=10).json()


# ----- 1. one bad client request ejects a healthy replica ----------------------------------------

# (llama-cpp-python's server answered 500 to a role `developer`, a json_schema and an unknown
# tool_choice; llama.cpp's own server, the suite's since, answers them 200)
BAD_REQUESTS = [
    pytest.param("transformers", LOGIT_BIAS, id="transformers-logit_bias"),
]


@pytest.mark.parametrize(("upstream", "bad"), BAD_REQUESTS, indirect=["upstream"])
def test_a_bad_request_is_tried_once_and_ejects_no_replica(upstream: Upstream, bad: dict[str, Any]):
    """The server answers 500 to a request that is the client's own mistake. On a4f111b chatgate tries
    it 3 times on the same replica, each a failure against its health, so one such request
    ejects the only replica (`/ready`: degraded), and the client gets 502 "The upstream model
    server failed (500): <the server's text>". Correct: tried once, counted against no replica,
    answered in the dialect's shape in the gateway's words."""
    params = {**GREEDY, **bad}
    said = server_error(upstream, params)
    assert upstream.ask(OPENAI, GREEDY).text  # healthy: a good request first
    assert {key: ready(upstream)[key] for key in ("status", "unhealthy")} == {
        "status": "ready",
        "unhealthy": [],
    }
    for _ in range(HEALTH_FAILURES):
        before = upstream.requests_seen()
        with pytest.raises(DialectError) as failed:  # held to the dialect's document
            upstream.ask(OPENAI, params)
        assert 400 <= failed.value.status < 600
        # tried once, or not at all where the gateway refuses it itself (a named tool_choice not
        # among the tools: the seed's rule, a 400 before any upstream)
        assert upstream.requests_seen() <= before + 1, "tried more than once"
        assert repeats(said, failed.value.body) == []
    assert ready(upstream)["status"] == "ready"


# ----- 2. n to a server that ignores it ----------------------------------------------------------


@on(*MODEL_SERVERS)
@pytest.mark.parametrize(
    "dialect", [DIALECTS[n] for n in ("openai", "aleph_alpha", "lmi")], ids=lambda d: d.name
)
def test_n_from_a_server_that_ignores_it_is_never_invented(upstream: Upstream, dialect: Dialect):
    """Both servers answer `n: 2` with one choice. On a4f111b chatgate adds a second, empty one
    (`{"index": 1, "message": {"content": ""}, "finish_reason": "stop"}`) and answers 200.
    Correct: a 422 naming n, or two real choices (two upstream requests joined). (OVMS's n needs
    best_of, which transformers serve refuses as a field it does not know.)"""
    whole = direct_text(upstream.direct(GREEDY))
    try:
        answer = upstream.ask(dialect, {**GREEDY, "n": 2})
    except DialectError as refused:
        assert refused.status == 422 and names("n", refused.body), refused.body
        return
    assert [choice.text for choice in answer.choices] == [whole, whole]


# ----- 3. Azure's n, passed through to an upstream that honours it --------------------------------


@on("litellm")
def test_azure_n_passed_through_gets_every_choice(upstream: Upstream):
    """Azure's document has no n; with `extra-parameters: pass-through` it goes to LiteLLM, whose
    mock answers 2 choices. On a4f111b: 502 "The upstream model server sent an unexpected response
    (ValueError: choice index 1 outside 0..0)". Correct: both choices."""
    headers = {"extra-parameters": "pass-through"}
    answer = upstream.ask(DIALECTS["azure"], {"messages": MESSAGES, "n": 2}, headers=headers)
    assert [choice.text for choice in answer.choices] == [LITELLM_MOCK_TEXT] * 2


# ----- 4. a stream that fails before its first token ---------------------------------------------


@on("transformers")
@pytest.mark.parametrize(
    "dialect", [DIALECTS[n] for n in ("openai", "azure", "aleph_alpha", "lmi")], ids=lambda d: d.name
)
def test_a_stream_that_fails_before_its_first_token_gets_an_error_status(
    upstream: Upstream, dialect: Dialect
):
    """transformers serve answers a streamed request with logit_bias 200, a role chunk, then
    `data: {"error": "`sequence_bias` has to be a dict with floats as values, …"}`. On a4f111b chatgate
    answers 200 and one error event. Correct: nothing was generated, so a real error status in
    the dialect's shape. (OVMS's document refuses logit_bias before any backend.)"""
    body = {"model": DEPLOYMENT, **GREEDY, **LOGIT_BIAS, "stream": True}
    headers = {"extra-parameters": "pass-through"} if dialect.name == "azure" else {}
    try:
        with dialect.post_stream(upstream.gateway, body, headers) as response:
            answered = response.read()
    except DialectError as failed:  # its body held to the dialect's document
        assert 400 <= failed.status < 600
        return
    pytest.fail(f"200 and a stream: {answered[:300]!r}")


# ----- 5. the upstream's error text reaches the client --------------------------------------------


# (llama-cpp-python's server answered a json_schema 500 with pydantic's errors and its file paths;
# llama.cpp's own server, the suite's since, decodes it under a grammar: LiteLLM's error text below)


@on("litellm")
@dialects()
def test_an_upstreams_own_error_text_never_reaches_the_client(upstream: Upstream, dialect: Dialect):
    """LiteLLM answers 500 "litellm.InternalServerError: InternalServerError: OpenAIException -
    Connection error.. Received Model Group=dead\\nAvailable Model Group Fallbacks=None" for a
    model whose upstream is down; today chatgate's 502 repeats it after "The upstream model server
    failed (500): ". Correct: the gateway's own words."""
    said = server_error(upstream, {"model": "dead", "messages": MESSAGES})
    with pytest.raises(DialectError) as failed:
        upstream.ask(dialect, {"messages": MESSAGES}, model="dead")
    assert failed.value.status == 502
    assert repeats(said, failed.value.body) == []


# ----- 6. the client's x-request-id forwarded upstream ---------------------------------------------


@on("llama.cpp")
@dialects()
def test_a_clients_request_id_is_not_forced_on_the_upstream(upstream: Upstream, dialect: Dialect):
    """llama-cpp-python's server refused an x-request-id that is not a UUID (400, empty body); llama.cpp's
    own server takes any. On a4f111b chatgate
    forwards the client's, so `x-request-id: client-trace-0042` gets 400 "(empty response)".
    Correct: the server's answer, and the client's id on it."""
    headers = {"x-request-id": "client-trace-0042"}
    answer = upstream.ask(dialect, GREEDY, headers=headers)
    assert answer.text == direct_text(upstream.direct(GREEDY))
    response = httpx.post(
        f"{upstream.gateway}{OPENAI.route.url}",
        json={"model": DEPLOYMENT, **GREEDY},
        headers=headers,
        timeout=60,
    )
    assert response.status_code == 200 and response.headers["x-request-id"] == "client-trace-0042"


# ----- 8. features the server ignores pass as 200 --------------------------------------------------


def honours_logprobs(choice: Choice) -> bool:
    return bool(choice.logprobs)


def honours_tools(choice: Choice) -> bool:
    return [name for name, _ in choice.tool_calls] == ["get_weather"]


def honours_json_mode(choice: Choice) -> bool:
    return choice.text.lstrip().startswith("{")


IGNORED_FEATURES = {
    "logprobs": ({"logprobs": True, "top_logprobs": 2}, honours_logprobs),
    "tools": ({"tools": [TOOL], "tool_choice": FORCED_TOOL}, honours_tools),
    "response_format": ({"response_format": {"type": "json_object"}}, honours_json_mode),
}


@on("transformers")
@pytest.mark.parametrize("feature", IGNORED_FEATURES)
def test_a_feature_the_server_ignores_is_refused_not_dropped(upstream: Upstream, feature: str):
    """transformers serve logs "Ignoring unsupported fields in the request" for logprobs, tools,
    tool_choice and response_format, and answers plain text. On a4f111b chatgate answers 200 with that
    text (no logprobs, no tool call, no JSON). Correct: a 422 naming the parameter, or the
    feature honoured. (n: test 2.)"""
    params, honoured = IGNORED_FEATURES[feature]
    try:
        answer = upstream.ask(OPENAI, {**GREEDY, **params})
    except DialectError as refused:
        assert refused.status == 422 and names(feature, refused.body), refused.body
        return
    (choice,) = answer.choices
    assert honoured(choice), f"200 without {feature}: {choice}"


# ----- 9. a stream from a server that sends no usage ---------------------------------------------


@on("llama.cpp")
@dialects(having="stream_usage")
def test_a_stream_without_upstream_usage_still_counts_the_prompt(upstream: Upstream, dialect: Dialect):
    """llama.cpp ignores `stream_options.include_usage`. On a4f111b chatgate's usage chunk says
    `"prompt_tokens": 0` (and counts completion tokens from non-empty chunks). Correct: the
    prompt counted (estimated, or by a tokenizer)."""
    answer = upstream.ask(dialect, GREEDY, stream=True)
    assert answer.prompt_tokens is not None and answer.prompt_tokens > 0


# ----- found while building these tests (not in the list) ---------------------------------
# (llama-cpp-python's server gave a forced call both in `tool_calls` and as the legacy
# `function_call`; llama.cpp's own server calls no tools: tests/integration/
# test_backend_openai_compatible.py holds the backend to one call)
