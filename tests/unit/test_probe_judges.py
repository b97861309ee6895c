"""The probes' judges, answer in → verdict out, and the narrowing they lead to: table-driven,
no server. The answers are shaped as real servers give them (llama.cpp's, transformers serve's)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from backends.openai_compatible import CAPABILITIES
from gateway.core.canonical import ChatRequest
from gateway.core.errors import UnprocessableContent
from gateway.dialects.registry import DIALECTS
from gateway.policy.capabilities import check
from gateway.probes.findings import Finding
from gateway.probes.judges import JSON_LINES
from gateway.probes.narrowing import narrowed, not_honoured
from gateway.probes.openai import OPENAI
from gateway.probes.probe_set import Answer
from gateway.probes.sets import PROBE_SETS, probe_set_of

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
    ("stop", [completion("one two three four five")], "deviates"),  # stopped, but kept in the text
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
    """Honoured, broken (a timeout proves nothing), deviates (a stop string kept: the request is
    still answered) and the features a request cannot ask for (auth, the stream's [DONE]) leave
    the capabilities as declared."""
    findings = [
        Finding("n", "honoured"),
        Finding("stop", "deviates"),
        Finding("tools", "broken"),
        Finding("auth", "ignored"),
        Finding("stream_done", "ignored"),
        Finding("max_tokens", "ignored"),
    ]
    assert not_honoured(findings) == set()
    assert narrowed(CAPABILITIES, set()) == CAPABILITIES


# ----- the other dialects: each judged in its own error shape and stream framing --------------

AZURE_ERROR = {"error": "Bad request", "message": "messages: not a list", "status": 400}
ALEPH_ALPHA_ERROR = {"error": "messages: not a list", "code": "BAD_REQUEST"}
LMI_ERROR = {"code": 400, "type": "BadRequestException", "message": "messages: not a list"}
OVMS_ERROR = {"error": "messages: not a list"}
OPENAI_ERROR = {"error": {"message": "messages: not a list"}}
FASTAPI_ERROR = {"detail": "messages: not a list"}
ERROR_SHAPES = {
    "openai": OPENAI_ERROR,
    "azure": AZURE_ERROR,
    "aleph_alpha": ALEPH_ALPHA_ERROR,
    "lmi": LMI_ERROR,
    "ovms": OVMS_ERROR,
}


def dialect_judged(dialect: str, feature: str, *answers: Answer) -> tuple[str, str]:
    probes = PROBE_SETS[dialect]
    probe = next(p for p in probes.probes if p.feature == feature)
    gated = None if probe.any_status else next(filter(None, map(probes.gate, answers)), None)
    return gated or probe.judge(list(answers))


@pytest.mark.parametrize("dialect", list(ERROR_SHAPES))
def test_an_error_is_honoured_only_in_its_own_dialects_shape(dialect: str):
    for other, body in [*ERROR_SHAPES.items(), ("fastapi", FASTAPI_ERROR)]:
        verdict, detail = dialect_judged(dialect, "error_shape", Answer(400, body, orjson.dumps(body)))
        # Azure's flat body is also OVMS's shape ({"error": str}), a superset of it
        expected = other == dialect or (dialect == "ovms" and other in ("azure", "aleph_alpha"))
        assert verdict == ("honoured" if expected else "broken"), (other, detail)


def lmi_stream(*lines: dict[str, Any], media_type: str = JSON_LINES) -> Answer:
    return Answer(200, streamed=True, chunks=lines, media_type=media_type)


LINE = {"choices": [{"index": 0, "delta": {"content": "one"}, "finish_reason": None}]}
LAST = {"choices": [{"index": 0, "delta": {"content": " two"}, "finish_reason": "length"}]}
LMI_STREAMS = [
    (lmi_stream(LINE, LAST), "honoured"),
    (lmi_stream(LINE), "ignored"),  # cut: no line says it ended
    (lmi_stream(LINE, LAST, media_type="text/event-stream"), "broken"),  # SSE, not JSON lines
    (completion(), "broken"),  # one JSON body
]


@pytest.mark.parametrize(("answer", "verdict"), LMI_STREAMS)
def test_an_lmi_stream_ends_with_its_finish_reason_on_a_json_line(answer: Answer, verdict: str):
    assert dialect_judged("lmi", "stream_done", answer)[0] == verdict


def test_ovms_logprobs_need_no_top_logprobs():
    token = {"token": "hi", "logprob": -0.1, "top_logprobs": []}
    assert dialect_judged("ovms", "logprobs", completion(logprobs={"content": [token]}))[0] == "honoured"
    assert dialect_judged("ovms", "logprobs", completion(logprobs=None))[0] == "ignored"
    assert dialect_judged("openai", "logprobs", completion(logprobs={"content": [token]}))[0] == "ignored"


@pytest.mark.parametrize("dialect", list(PROBE_SETS))
def test_every_dialect_probes_or_names_each_feature_once(dialect: str):
    probes = PROBE_SETS[dialect]
    probed = [p.feature for p in probes.probes]
    assert len(probed) == len(set(probed)) and not set(probed) & set(probes.absent)
    assert set(probed) | set(probes.absent) == set(PROBES)  # OpenAI's are the whole list
    # every request of the set stays greedy but where sampling is the point (n, seed)
    for probe in probes.probes:
        for body in probe.bodies:
            if probe.feature not in ("n", "seed", "error_shape"):
                assert body.get("temperature") == 0, (dialect, probe.feature)


@pytest.mark.parametrize("dialect", list(DIALECTS))
def test_every_dialect_names_a_probe_set_that_exists_or_none(dialect: str):
    """A registered dialect's probes are looked up by the name it declares (a name that is not a
    set would leave it unprobed without a word: it is caught here)."""
    named = DIALECTS[dialect].probes
    assert named is None or named in PROBE_SETS
    assert probe_set_of(dialect) is (None if named is None else PROBE_SETS[named])


def test_a_dialect_not_registered_has_no_probes_and_no_key_error():
    assert probe_set_of("klingon") is None


def test_azure_core_error_object_is_azures_shape_too():
    """What chatgate's Azure dialect and Azure itself send (the azure-ai-inference SDK reads it)."""
    for body in (
        {"error": {"code": "BadRequest", "message": "messages: not a list"}},
        {
            "error": {"code": "BadRequest", "message": "m"},
            "message": "m",
            "status": 400,
            "code": "BadRequest",
        },
    ):
        verdict, detail = dialect_judged("azure", "error_shape", Answer(400, body, orjson.dumps(body)))
        assert verdict == "honoured", detail
    no_code = {"error": {"message": "messages: not a list"}}
    verdict, _ = dialect_judged("azure", "error_shape", Answer(400, no_code, orjson.dumps(no_code)))
    assert verdict == "broken"


def test_a_kept_stop_string_deviates_from_the_document_and_says_so():
    """Generation stopped at the stop string, but the text keeps it, where OpenAI's document says
    the returned text leaves it out: not honoured, its own verdict, with what was seen."""
    verdict, detail = judged("stop", completion("one two three four five"))
    assert verdict == "deviates"
    assert "keeps the stop string" in detail and "four five" in detail
    anthropic = next(p for p in PROBE_SETS["anthropic"].probes if p.feature == "stop")
    kept = Answer(200, {"content": [{"type": "text", "text": "one two three four five"}]}, b"{}")
    assert anthropic.judge([kept])[0] == "deviates"


@pytest.mark.parametrize("dialect", list(DIALECTS))
def test_each_listing_is_a_get_of_the_dialects_document_and_reads_its_example(dialect: str):
    """The model a conformance run names without --model comes from the operation the probe set
    names, at the path the dialect's document gives; its reader finds the model in the document's
    own example answer. A dialect without one has no GET that lists models, and the run says so."""
    from gateway.http.documents import load_document
    from gateway.tools.conformance_target import names_a_model, operation_path

    probes, document = probe_set_of(dialect), load_document(DIALECTS[dialect].document)
    assert probes is not None
    if probes.listing is None:
        gets = [item["get"]["operationId"] for item in document["paths"].values() if "get" in item]
        assert not any("model" in operation.lower() for operation in gets), gets
        assert names_a_model(dialect, document) == (dialect == "ovms")  # LMI's requests need none
        return
    path = operation_path(document, probes.listing.operation)
    assert path is not None, probes.listing.operation
    answer = document["paths"][path]["get"]["responses"]["200"]["content"]["application/json"]
    found = probes.listing.name_of(answer["example"])
    assert isinstance(found, str) and found
