"""The probes' judges, answer in → verdict out, and the narrowing they lead to: table-driven,
no server. The answers are shaped as real servers give them (llama.cpp's, transformers serve's)."""

from __future__ import annotations

from typing import Any

import pytest

from backends.openai_compatible import CAPABILITIES
from gateway.core.canonical import ChatRequest
from gateway.core.errors import UnprocessableContent
from gateway.policy.capabilities import check
from gateway.probes.findings import Finding
from gateway.probes.narrowing import narrowed, not_honoured
from gateway.probes.openai import OPENAI
from gateway.probes.probe_set import Answer

PROBES = {probe.feature: probe for probe in OPENAI.probes}


def completion(content: str | None = "hi", **choice: Any) -> Answer:
    message = {"role": "assistant", "content": content, **choice.pop("message", {})}
    body = {"choices": [{"index": 0, "message": message, "finish_reason": "stop", **choice}]}
    return Answer(200, body, b"{}")


def judged(feature: str, *answers: Answer) -> tuple[str, str]:
    probe = PROBES[feature]
    gated = None if probe.any_status else next(filter(None, map(OPENAI.gate, answers)), None)
    return gated or probe.judge(list(answers))


TOP = {"token": "hi", "logprob": -0.1, "top_logprobs": [{"token": "hi", "logprob": -0.1}]}
CALL = {
    "tool_calls": [{"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]
}
CASES = [
    # llama.cpp: logprobs, tools and json honoured; n ignored; no usage chunk
    ("logprobs", [completion(logprobs={"content": [TOP]})], "honoured"),
    ("tools", [completion(None, message=CALL, finish_reason="tool_calls")], "honoured"),
    ("json_object", [completion('{"word": "hello"}')], "honoured"),
    ("json_schema", [completion('{"probe_answer": 3}')], "honoured"),
    ("n", [completion()], "ignored"),
    ("stream_usage", [Answer(200, streamed=True, chunks=({"choices": []},), done=True)], "ignored"),
    # transformers serve: logprobs, tools, response_format ignored
    ("logprobs", [completion(logprobs=None)], "ignored"),
    ("tools", [completion("It is sunny in Paris.")], "ignored"),
    ("json_schema", [completion('{"word": "hello"}')], "ignored"),
    ("json_object", [completion("Hello!")], "ignored"),
    # stop: cut, kept, or run past
    ("stop", [completion("one two three four ")], "honoured"),
    ("stop", [completion("one two three four five")], "honoured"),
    ("stop", [completion("one two three four five six")], "ignored"),
    ("seed", [completion("a"), completion("b")], "ignored"),
    ("max_tokens", [completion("one two three four five six", finish_reason="stop")], "ignored"),
    # refusals and failures
    (
        "n",
        [Answer(400, {"error": {"message": "n must be 1"}}, b'{"error": {"message": "n must be 1"}}')],
        "refused",
    ),
    ("n", [Answer(500, None, b"oops")], "broken"),
    ("n", [Answer(429, None, b"")], "broken"),
    ("n", [Answer(failure="no answer within 1 s")], "broken"),
    ("stream_done", [completion()], "broken"),  # stream: true answered as one JSON body
    ("error_shape", [Answer(200, {}, b"{}")], "ignored"),
    ("error_shape", [Answer(500, None, b"")], "broken"),
    ("auth", [Answer(401, None, b"")], "honoured"),
]


@pytest.mark.parametrize(("feature", "answers", "verdict"), CASES)
def test_each_answer_earns_its_verdict(feature: str, answers: list[Answer], verdict: str):
    assert judged(feature, *answers)[0] == verdict


def test_a_refusal_says_the_servers_words():
    raw = b'{"error": {"message": "n must be 1", "param": "n"}}'
    assert judged("n", Answer(400, {}, raw)) == ("refused", "HTTP 400: n must be 1")


NARROWING_CASES = [
    ("n", {"n": 2}, "n"),
    ("logprobs", {"logprobs": True, "top_logprobs": 2}, "logprobs"),
    ("tools", {"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ("json_object", {"response_format": {"type": "json_object"}}, "response_format"),
    ("stop", {"stop": ["x"]}, "stop"),
    ("seed", {"seed": 1}, "seed"),
]


@pytest.mark.parametrize(("feature", "fields", "param"), NARROWING_CASES)
def test_a_feature_not_honoured_is_a_422_naming_its_parameter(feature: str, fields: dict, param: str):
    request = ChatRequest(model="m", messages=[{"role": "user", "content": "hi"}], **fields)
    check(request, CAPABILITIES, 1)  # as declared: accepted
    for verdict in ("ignored", "refused"):
        narrow = narrowed(CAPABILITIES, not_honoured([Finding(feature, verdict)]))
        with pytest.raises(UnprocessableContent) as refused:
            check(request, narrow, 1)
        assert refused.value.param == param


def test_only_evidence_narrows():
    """Honoured, broken (a timeout proves nothing) and the features a request cannot ask for
    (auth, the stream's [DONE]) leave the capabilities as declared."""
    findings = [
        Finding("n", "honoured"),
        Finding("tools", "broken"),
        Finding("auth", "ignored"),
        Finding("stream_done", "ignored"),
        Finding("max_tokens", "ignored"),
    ]
    assert not_honoured(findings) == set()
    assert narrowed(CAPABILITIES, set()) == CAPABILITIES
