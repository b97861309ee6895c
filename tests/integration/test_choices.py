"""Choices as the upstream gave them (issue 25): `n` through a real `chatgate serve` to a real
loopback upstream that honours `n` or ignores it (tests/support/choices_upstream.py), in every dialect.

An upstream that ignores `n` never gets an invented, empty choice in its answer: the gateway
refuses (422 naming n), or fans out (n upstream requests, joined), as the deployment's `options.n`
says. Azure's `n` through `extra-parameters: pass-through` reaches an upstream that honours it and
its answer keeps every choice, whole and streamed.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml

from backends.http.fan_out import summed
from backends.openai_compatible import OpenAICompatibleBackend
from gateway.core.canonical import (
    CompletionTokensDetails,
    Finish,
    PromptTokensDetails,
    TextDelta,
    Usage,
    gather,
)
from tests.support.choices_upstream import COMPLETION_TOKENS, PROMPT_TOKENS, ChoicesUpstream, choice_text
from tests.support.readers import chat_shaped, reader
from tests.support.servers import CHAT_PATHS, running_gateway

DIALECTS = chat_shaped()  # `n` choices: only where answers have OpenAI's `choices`
TIMEOUT = 30.0
# each dialect's word for a natural end
NATURAL_END = {dialect: reader(dialect).natural_end for dialect in DIALECTS}
# OVMS: n above 1 needs best_of, and does not stream (ovms.yaml, rule n-at-most-best_of)
CASES = [
    pytest.param(dialect, stream, id=f"{dialect}-{'stream' if stream else 'json'}")
    for dialect in DIALECTS
    for stream in (False, True)
    if not (dialect == "ovms" and stream)
]
# dialects whose stream carries the usage (asked for with stream_options, or always: Azure)
STREAM_USAGE = {dialect for dialect in DIALECTS if reader(dialect).stream_usage}


@pytest.fixture(scope="module")
def upstream() -> Iterator[ChoicesUpstream]:
    with ChoicesUpstream() as server:
        yield server


def deployment(name: str, upstream: ChoicesUpstream, behaviour: str, **options: Any) -> dict[str, Any]:
    return {
        "name": name,
        "backend": "openai-compatible",
        "options": {"base_url": upstream.base_url(behaviour), "first_byte": 20, "total": 30, **options},
    }


def start(tmp_path_factory: pytest.TempPathFactory, log_dir: Path, deployments: list[dict]) -> Iterator[str]:
    config = tmp_path_factory.mktemp("choices") / "config.yaml"
    config.write_text(yaml.safe_dump({"deployments": deployments}))
    with running_gateway(log_dir, config) as url:
        yield url


@pytest.fixture(scope="module")
def gateway(
    tmp_path_factory: pytest.TempPathFactory, log_dir: Path, upstream: ChoicesUpstream
) -> Iterator[str]:
    """Deployments with the default `options.n` (native)."""
    yield from start(
        tmp_path_factory,
        log_dir,
        [deployment("ignores", upstream, "ignores"), deployment("honours", upstream, "honours")],
    )


@pytest.fixture(scope="module")
def configured(
    tmp_path_factory: pytest.TempPathFactory, log_dir: Path, upstream: ChoicesUpstream
) -> Iterator[str]:
    """Deployments whose upstream ignores `n`, and that say what to do about it."""
    yield from start(
        tmp_path_factory,
        log_dir,
        [
            deployment("fan-out", upstream, "ignores", n="fan-out"),
            deployment("refuse", upstream, "ignores", n="refuse"),
            deployment("fan-out-stalls", upstream, "stalls", n="fan-out"),
        ],
    )


# ----- a client in any dialect ------------------------------------------------------------------


@dataclass
class Answer:
    status: int
    choices: dict[int, dict[str, Any]] = field(default_factory=dict)
    usage: tuple[int, int, int] | None = None
    errors: list[str] = field(default_factory=list)  # an error body's message, or a stream's


def usage_of(body: dict[str, Any]) -> tuple[int, int, int] | None:
    usage = body.get("usage")
    return (usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]) if usage else None


def ask(gateway: str, dialect: str, model: str, stream: bool, n: int = 2, **params: Any) -> Answer:
    """`n` choices of `model`, in the dialect (Azure's `n` is an extra parameter, passed through)."""
    reading = reader(dialect)
    body = reading.body("hi", model, stream=stream, **params)
    headers = {}
    if n != 1:
        body["n"] = n
        if dialect == "azure":
            headers["extra-parameters"] = "pass-through"
        if dialect == "ovms":
            body["best_of"] = n
    url = gateway + CHAT_PATHS[dialect]
    if not stream:
        response = httpx.post(url, json=body, headers=headers, timeout=TIMEOUT)
        answer = Answer(response.status_code)
        said = response.json()
        if reading.is_error(said):
            answer.errors.append(reading.error_message(said))
            return answer
        answer.usage = usage_of(said)
        for choice in said["choices"]:
            assert choice["index"] not in answer.choices, "a choice index given twice"
            text = choice["message"].get("content") or ""
            answer.choices[choice["index"]] = {"text": text, "finish": choice["finish_reason"]}
        return answer
    with httpx.stream("POST", url, json=body, headers=headers, timeout=TIMEOUT) as response:
        answer = Answer(response.status_code)
        if response.status_code != 200:  # refused before the stream began: a whole error body
            answer.errors.append(reading.error_message(orjson.loads(response.read())))
            return answer
        # SSE's data lines (an error comes as `event: error` and its data line), or LMI's JSON lines
        events = reading.events(response.iter_lines())
    for said in events:
        if reading.is_error(said):
            answer.errors.append(reading.error_message(said))
            continue
        answer.usage = usage_of(said) or answer.usage
        for choice in said.get("choices") or ():
            folded = answer.choices.setdefault(choice["index"], {"text": "", "finish": None})
            folded["text"] += (choice.get("delta") or {}).get("content") or ""
            folded["finish"] = choice.get("finish_reason") or folded["finish"]
    return answer


def names_n(message: str) -> bool:
    return "'n'" in message


# ----- an upstream that ignores n ---------------------------------------------------------------


@pytest.mark.parametrize(("dialect", "stream"), CASES)
def test_an_upstream_that_ignores_n_gets_no_invented_choice(
    gateway: str, upstream: ChoicesUpstream, dialect: str, stream: bool
) -> None:
    """Finding 2: the upstream answered one choice of the two asked; the gateway used to add an
    empty second one that 'stopped' (LMI: `eos_token`)."""
    before = len(upstream.received)
    answer = ask(gateway, dialect, "ignores", stream)
    assert all(choice["text"] for choice in answer.choices.values()), f"an empty choice: {answer}"
    assert 1 not in answer.choices, f"a choice the upstream never gave: {answer}"
    [error] = answer.errors
    assert names_n(error) and "1 of the 2 choices" in error
    if not stream:
        assert answer.status == 422 and answer.choices == {}
    else:  # the status went out with the first choice's first chunk; the stream ends in an error
        assert answer.status == 200
        assert answer.choices[0]["text"] == choice_text(before + 1, 0)
    # the upstream's ignoring is the deployment's, not a failing replica's: not tried again
    assert len(upstream.received) == before + 1


@pytest.mark.parametrize("dialect", DIALECTS)
def test_one_choice_from_an_upstream_that_ignores_n_is_answered(gateway: str, dialect: str) -> None:
    answer = ask(gateway, dialect, "ignores", stream=False, n=1)
    assert answer.status == 200 and list(answer.choices) == [0], answer
    assert answer.choices[0]["finish"] == NATURAL_END[dialect]


# ----- an upstream that honours n ---------------------------------------------------------------


@pytest.mark.parametrize(("dialect", "stream"), CASES)
def test_an_upstream_that_honours_n_answers_every_choice(
    gateway: str, upstream: ChoicesUpstream, dialect: str, stream: bool
) -> None:
    """Finding 3 (Azure): `n` passed through reached an upstream that answered two choices; the
    gateway said 502 "choice index 1 outside 0..0", tried twice more and ejected the replica.
    Streamed, the upstream interleaves the two choices' chunks."""
    before = len(upstream.received)
    answer = ask(gateway, dialect, "honours", stream)
    assert answer.status == 200 and answer.errors == [], answer
    k = before + 1
    assert answer.choices == {
        i: {"text": choice_text(k, i), "finish": NATURAL_END[dialect]} for i in range(2)
    }
    [(behaviour, sent)] = upstream.received[before:]  # one upstream request, which asked for both
    assert behaviour == "honours" and sent["n"] == 2
    if not stream or dialect in STREAM_USAGE:
        completion = 2 * COMPLETION_TOKENS
        assert answer.usage == (PROMPT_TOKENS, completion, PROMPT_TOKENS + completion)


# ----- options.n: fan-out ------------------------------------------------------------------------


@pytest.mark.parametrize(("dialect", "stream"), CASES)
def test_fan_out_joins_n_upstream_answers(
    configured: str, upstream: ChoicesUpstream, dialect: str, stream: bool
) -> None:
    before = len(upstream.received)
    answer = ask(configured, dialect, "fan-out", stream, n=3)
    assert answer.status == 200 and answer.errors == [], answer
    sent = [body for behaviour, body in upstream.received[before:] if behaviour == "ignores"]
    assert len(sent) == 3 and all("n" not in body for body in sent)
    # each choice is one upstream request's only choice, under its own index
    assert sorted(answer.choices) == [0, 1, 2]
    requests = set()
    for choice in answer.choices.values():
        assert choice["finish"] == NATURAL_END[dialect]
        k = int(choice["text"].split()[1])
        assert choice["text"] == choice_text(k, 0) and before < k <= before + 3
        requests.add(k)
    assert len(requests) == 3
    if not stream or dialect in STREAM_USAGE:  # the sum of the three upstream answers' usage
        prompt, completion = 3 * PROMPT_TOKENS, 3 * COMPLETION_TOKENS
        assert answer.usage == (prompt, completion, prompt + completion)


def test_fan_out_gives_each_request_its_own_seed(configured: str, upstream: ChoicesUpstream) -> None:
    """The same seed in every request would make the n choices one choice n times."""
    before = len(upstream.received)
    answer = ask(configured, "openai", "fan-out", stream=False, n=3, seed=7)
    assert answer.status == 200 and len(answer.choices) == 3
    assert sorted(body["seed"] for _, body in upstream.received[before:]) == [7, 8, 9]


def test_fan_out_of_one_choice_is_one_request(configured: str, upstream: ChoicesUpstream) -> None:
    before = len(upstream.received)
    answer = ask(configured, "openai", "fan-out", stream=True, n=1)
    assert answer.status == 200 and list(answer.choices) == [0]
    assert len(upstream.received) == before + 1


def test_a_client_leaving_a_fan_out_hangs_up_on_every_upstream_request(
    configured: str, upstream: ChoicesUpstream
) -> None:
    body = {
        "model": "fan-out-stalls",
        "messages": [{"role": "user", "content": "hi"}],
        "n": 3,
        "stream": True,
    }
    before = len(upstream.received)
    with httpx.stream("POST", configured + CHAT_PATHS["openai"], json=body, timeout=TIMEOUT) as response:
        assert response.status_code == 200
        first = next(line for line in response.iter_lines() if line.startswith("data: "))
        assert json.loads(first.removeprefix("data: "))["choices"], "the stream has begun"
        # the first choice may begin before the other two requests have reached the upstream
        asked_by = time.monotonic() + 10
        while len(upstream.received) < before + 3 and time.monotonic() < asked_by:
            time.sleep(0.01)
        assert len(upstream.received) == before + 3
    # the client has gone: the three upstream answers it was waiting on are closed
    deadline = time.monotonic() + 10
    while upstream.hung_up < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert upstream.hung_up == 3


# ----- options.n: refuse -------------------------------------------------------------------------


@pytest.mark.parametrize(("dialect", "stream"), CASES)
def test_refuse_answers_422_naming_n_before_asking_the_upstream(
    configured: str, upstream: ChoicesUpstream, dialect: str, stream: bool
) -> None:
    before = len(upstream.received)
    answer = ask(configured, dialect, "refuse", stream)
    assert answer.status == 422 and answer.choices == {}, answer
    [error] = answer.errors
    assert names_n(error)
    assert len(upstream.received) == before
    one = ask(configured, dialect, "refuse", stream, n=1)
    assert one.status == 200 and list(one.choices) == [0] and one.errors == []


# ----- in process ---------------------------------------------------------------------------------


def test_a_fan_out_asks_for_no_more_choices_than_its_connections() -> None:
    def most(**options: Any) -> int:
        return OpenAICompatibleBackend("m", base_url="http://up/v1", **options).capabilities.max_n

    assert (most(), most(n="refuse"), most(n="fan-out", max_connections=4)) == (128, 1, 4)


def test_a_fan_outs_usage_is_the_sum_of_its_answers() -> None:
    one = Usage(3, 2, CompletionTokensDetails(reasoning_tokens=1), PromptTokensDetails(cached_tokens=2))
    other = Usage(4, 5, CompletionTokensDetails(reasoning_tokens=2, audio_tokens=1))
    total = summed([one, other, Usage(1, 1)])
    assert (total.prompt_tokens, total.completion_tokens) == (8, 8)
    assert total.completion_tokens_details == CompletionTokensDetails(reasoning_tokens=3, audio_tokens=1)
    assert total.prompt_tokens_details == PromptTokensDetails(cached_tokens=2)


async def events(*items: Any) -> Any:
    for item in items:
        yield item


def test_a_gathered_completion_has_the_choices_its_events_gave() -> None:
    gathered = asyncio.run(gather(events(TextDelta(1, "b"), Finish(1, "stop"), TextDelta(0, "a"))))
    choices = [(c.index, c.text, c.finish_reason) for c in gathered.choices]
    assert choices == [(0, "a", None), (1, "b", "stop")]
    assert asyncio.run(gather(events(Usage(3, 0)))).choices == []
