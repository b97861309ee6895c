"""chatgate in front of real model servers nobody on this project wrote (tests/support/real_servers.py):
Hugging Face `transformers serve` and llama.cpp's server on the tiny model of tests/support/tiny_model.py,
and LiteLLM's proxy with mock models. Every dialect's request goes through a real `chatgate serve`
(an openai-compatible deployment) and is read with the dialect's SDK or held to its document
(tests/support/dialect_clients.py).

What a gateway answers is compared with what the server itself answers to the same request sent
directly, so nothing here knows what the random tiny model says: greedy answers (temperature 0)
and seeded samples are repeatable. Each server and its gateway start once per module.

The servers differ in what they honour, and the tests say which one shows what:
- transformers serve: max_tokens, stop (it keeps the stop string in the text), usage in streams;
  it ignores seed (it decodes greedily), n, logprobs, tools and response_format.
- llama.cpp (its own server): max_tokens, stop, seed, logprobs, JSON mode (a grammar); tools ignored; it
  ignores n, and sends no usage in streams.
- LiteLLM's mock: n, a master key, an upstream that is down (500) and one that is limited (429).
Where chatgate gets these servers wrong today, tests/system/test_real_servers_findings.py says so.
"""

from __future__ import annotations

import time

import pytest

from tests.support.dialect_clients import DIALECTS, Dialect, DialectError
from tests.support.real_server_fixtures import (  # noqa: F401  (fixtures)
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
from tests.support.real_servers import LITELLM_KEY, LITELLM_MOCK_TEXT


@pytest.fixture
def upstream(request: pytest.FixtureRequest) -> Upstream:
    return named_upstream(request)


def streamed() -> pytest.MarkDecorator:
    return pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])


def cases(
    servers: list[str], having: str | None = None, leave_out: tuple[str, str, bool] | None = None
) -> pytest.MarkDecorator:
    """(upstream, dialect, stream) for every server, dialect (`having`) and both ways, but the
    one `leave_out` names."""
    chosen = [
        pytest.param(
            server, dialect, stream, id=f"{'streamed' if stream else 'plain'}-{dialect.name}-{server}"
        )
        for server in servers
        for dialect in DIALECTS.values()
        if having is None or getattr(dialect, having)
        for stream in (False, True)
        if (dialect.name, server, stream) != leave_out
    ]
    return pytest.mark.parametrize(("upstream", "dialect", "stream"), chosen, indirect=["upstream"])


# ----- answers, plain and streamed ---------------------------------------------------------------


@on(*MODEL_SERVERS)
@dialects()
@streamed()
def test_answer_is_the_servers_own(upstream: Upstream, dialect: Dialect, stream: bool):
    """max_tokens ends the answer with the dialect's `length`; text and counts are the server's."""
    direct = upstream.direct(GREEDY)
    assert direct["choices"][0]["finish_reason"] == "length"
    answer = upstream.ask(dialect, GREEDY, stream=stream)
    assert answer.text == direct_text(direct)
    assert answer.finish == dialect.length
    if stream and (upstream.name == "llama.cpp" or not dialect.stream_usage):
        return  # llama.cpp sends no usage in a stream (the findings say what chatgate makes of it)
    assert (answer.prompt_tokens, answer.completion_tokens) == (
        direct["usage"]["prompt_tokens"],
        direct["usage"]["completion_tokens"],
    )
    assert answer.completion_tokens == GREEDY["max_tokens"]


@on("litellm")
@dialects()
@streamed()
def test_litellm_mock_answers_through_its_master_key(upstream: Upstream, dialect: Dialect, stream: bool):
    answer = upstream.ask(dialect, {"messages": MESSAGES}, stream=stream)
    assert answer.text == LITELLM_MOCK_TEXT
    assert answer.finish == dialect.stop
    direct = upstream.direct({"messages": MESSAGES, "stream": False}, model="mock")
    if not stream:
        assert answer.prompt_tokens == direct["usage"]["prompt_tokens"] > 0
    if not stream or dialect.stream_usage:
        assert answer.completion_tokens and answer.completion_tokens > 0


# ----- stop, seed -------------------------------------------------------------------------------


def stop_string(text: str) -> tuple[str, int]:
    """Two characters of `text`, past its start, that occur there first: (them, where)."""
    for at in range(2, len(text) - 2):
        candidate = text[at : at + 2]
        if (
            candidate.isprintable()
            and candidate.strip()
            and "\ufffd" not in candidate
            and text.find(candidate) == at
        ):
            return candidate, at
    raise AssertionError(f"no stop string to pick in {text!r}")


# (an OVMS stream with a stop string to transformers serve is in the findings: refused today)
@cases(MODEL_SERVERS, leave_out=("ovms", "transformers", True))
def test_stop_string_ends_the_answer(upstream: Upstream, dialect: Dialect, stream: bool):
    """The answer ends where the stop string first appears in the unstopped one: llama.cpp cuts
    it off; transformers serve keeps it (and the rest of the token that made it)."""
    whole = direct_text(upstream.direct({**GREEDY, "max_tokens": 16}))
    stop, at = stop_string(whole)
    params = {**GREEDY, "max_tokens": 16, "stop": [stop]}
    answer = upstream.ask(dialect, params, stream=stream)
    assert answer.text == direct_text(upstream.direct(params))
    if upstream.name == "llama.cpp":
        assert answer.text == whole[:at]
    else:
        assert whole.startswith(answer.text) and answer.text.startswith(whole[: at + len(stop)])
    assert answer.finish in (dialect.stop, "stop_sequence")


@on(*MODEL_SERVERS)
@dialects(having="has_seed")
def test_seed_reaches_the_server(upstream: Upstream, dialect: Dialect):
    """A seeded sample is the server's own for that seed, every time; llama.cpp samples, so
    another seed gives another answer there (transformers serve decodes greedily whatever the
    seed)."""
    sampled = {"messages": MESSAGES, "temperature": 1.0, "max_tokens": 8}
    seven = direct_text(upstream.direct({**sampled, "seed": 7}))
    if upstream.name == "llama.cpp":
        assert seven != direct_text(upstream.direct({**sampled, "seed": 8}))
    for _ in range(2):
        assert upstream.ask(dialect, {**sampled, "seed": 7}).text == seven


# ----- n, logprobs, tools, JSON mode: where the server honours them ------------------------------


# (OVMS's document refuses n > 1 in a stream: tests/integration/test_bad_input.py)
@cases(["litellm"], having="has_n", leave_out=("ovms", "litellm", True))
def test_n_choices_from_a_server_that_honours_n(upstream: Upstream, dialect: Dialect, stream: bool):
    answer = upstream.ask(dialect, {"messages": MESSAGES, "n": 2}, stream=stream)
    assert [c.text for c in answer.choices] == [LITELLM_MOCK_TEXT] * 2
    assert [c.finish for c in answer.choices] == [dialect.stop] * 2


@on("llama.cpp")
@dialects(having="has_logprobs")
@streamed()
def test_logprobs_are_the_servers(upstream: Upstream, dialect: Dialect, stream: bool):
    """(llama-cpp-python returns logprobs only when top_logprobs is set, which OVMS's document
    refuses: an OVMS client gets none from it, as from the server directly.)"""
    params = {**GREEDY, "max_tokens": 4, "logprobs": True, "top_logprobs": 2}
    direct = upstream.direct(params)["choices"][0]["logprobs"]["content"]
    answer = upstream.ask(dialect, params, stream=stream)
    (choice,) = answer.choices
    assert choice.logprobs is not None
    assert [token for token, _ in choice.logprobs] == [entry["token"] for entry in direct]
    assert [logprob for _, logprob in choice.logprobs] == pytest.approx([e["logprob"] for e in direct])
    assert "".join(token for token, _ in choice.logprobs) == choice.text


@on("llama.cpp")
@dialects(having="has_tools")
def test_a_forced_tool_call_llama_server_would_ignore_is_refused(upstream: Upstream, dialect: Dialect):
    """llama.cpp's own server accepts tools and a forced tool_choice and answers text (llama-cpp-python
    forced the call with a grammar). The deployment's probe finds the tools ignored, so a forced
    call is a 422 naming them, never text passed off as the call. (vLLM honours it:
    tests/system/test_fleet_servers.py.)"""
    params = {**GREEDY, "max_tokens": 12, "tools": [TOOL], "tool_choice": FORCED_TOOL}
    direct = upstream.direct(params)["choices"][0]
    assert not direct["message"].get("tool_calls") and direct["message"]["content"]
    with pytest.raises(DialectError) as refused:
        upstream.ask(dialect, params, stream=True)
    assert refused.value.status == 422 and "tool" in str(refused.value.body)


@on("llama.cpp")
@dialects(having="has_json_mode")
def test_json_mode_reaches_the_server(upstream: Upstream, dialect: Dialect):
    """JSON mode makes llama.cpp decode with a JSON grammar: the answer is the server's own under
    it (a random model's object may begin with whitespace and is cut at max_tokens), not the
    answer to the same request without it."""
    params = {**GREEDY, "max_tokens": 6, "response_format": {"type": "json_object"}}
    answer = upstream.ask(dialect, params)
    assert answer.text == direct_text(upstream.direct(params))
    assert answer.text != direct_text(upstream.direct({**GREEDY, "max_tokens": 6}))
    assert not answer.text.strip() or answer.text.lstrip().startswith("{")


# ----- upstream errors --------------------------------------------------------------------------


@on("litellm")
@dialects()
def test_an_upstream_that_fails_is_a_502_in_the_dialects_shape(upstream: Upstream, dialect: Dialect):
    """LiteLLM answers 500 for a model whose own upstream is down; the gateway tries again, then
    answers 502 (the dialect's document for 502 holds the body)."""
    with pytest.raises(DialectError) as failed:
        upstream.ask(dialect, {"messages": MESSAGES}, model="dead")
    assert failed.value.status == 502


@on("litellm")
@dialects()
def test_an_upstream_429_is_a_429_in_the_gateways_words(upstream: Upstream, dialect: Dialect):
    with pytest.raises(DialectError) as failed:
        upstream.ask(dialect, {"messages": MESSAGES}, model="limited")
    assert failed.value.status == 429
    assert "mock rate limit" not in str(failed.value.body)  # LiteLLM's words are about the gateway's quota


@on("litellm")
@dialects()
def test_credentials_litellm_refuses_are_a_502_and_no_key_is_logged(upstream: Upstream, dialect: Dialect):
    """A deployment without LiteLLM's master key gets LiteLLM's 401: the client gets a 502 that
    repeats nothing of LiteLLM's answer, and the gateway's log names the upstream; the key the
    other deployments send is in no log line."""
    assert upstream.ask(dialect, {"messages": MESSAGES}).text == LITELLM_MOCK_TEXT  # the key is sent
    with pytest.raises(DialectError) as failed:
        upstream.ask(dialect, {"messages": MESSAGES}, model="no-key")
    assert failed.value.status == 502
    assert "api key" not in str(failed.value.body).lower()  # LiteLLM's "No api key passed in."
    said = f"upstream {upstream.server.base_url} refused the gateway's credentials (401)"
    ends = time.monotonic() + 10  # the log is written off the event loop: it may lag the answer
    while said not in (log := upstream.gateway_log_text()) and time.monotonic() < ends:
        time.sleep(0.1)
    assert said in log
    assert LITELLM_KEY not in log
