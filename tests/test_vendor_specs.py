"""What chatgate answers, checked against the vendors' own documents (the refspecs, found as
tests/conftest.py says; every test here is skipped, with the way to get them, when there are none).

A real gateway process (keys, limits, a content filter, a text-only deployment) answers a
corpus of requests that touches every documented feature of the OpenAI, Azure and Aleph Alpha
dialects: plain and streamed answers, n, logprobs, tools, JSON output, include_usage, finish
reasons, and the errors 400/401/404/422/429. Every completion, every stream chunk and every
error body is validated against the vendor's schema for it (gateway/vendor_specs.py reads the
documents once per session).

Where chatgate answers differently on purpose, the difference is a `Deviation` in
gateway/vendor_specs.py with its reason; `test_every_deviation_is_still_needed` fails when one
stops being needed. The decisions, in short:

- OpenAI: none. Our answers are valid for CreateChatCompletionResponse,
  CreateChatCompletionStreamResponse, ErrorResponse, Model and ListModelsResponse as written
  (with `nullable: true` read as "or null", which the 3.1 file means but no longer says).
- Azure (2024-05-01-preview, Swagger 2.0): chunks are `chat.completion.chunk`, `usage` only in
  the last chunk, a usage-only chunk may have no choices, `content` may be null in a chunk,
  tool-call fragments need not repeat id/function, `/info` says `chat_completion` (the seed's
  and the SDK's spelling). Error bodies are the seed's flat shape, not Azure.Core's
  `{error: {code, message}}` — the two disagree on the type of `error` — so they are not
  checked against the document; the `x-ms-error-code` header, which both carry, is.
- Aleph Alpha (the 4.7.0 extract): its numbers and booleans are strings, read as values; its
  dangling `SteeringConceptRef` accepts anything; `finish_reason`, `logprobs`, `usage` and
  `system_fingerprint` are null in stream chunks as its own descriptions say, though its
  schemas do not mark them nullable; its 200 answer is typed as an array of ChatResponse (an
  artefact of the copy): each body and each chunk is checked as one ChatResponse. It documents
  no error body.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml

from gateway.policy.auth import new_key
from gateway.spec import load_document
from gateway.tools.vendor_specs import (
    CHUNK,
    COMPLETION,
    ERROR,
    VENDOR_DOCUMENTS,
    VendorSpecs,
    vendor_schemas,
)
from tests.servers import running_gateway

KEY, KEY_SHA = new_key()
CHAT_PATHS = {
    "openai": "/v1/chat/completions",
    "azure": "/azure/chat/completions?api-version=2024-05-01-preview",
    "aleph_alpha": "/aleph-alpha/chat/completions",
}
SPEC_FILES = {"openai": "openai.yaml", "azure": "azure.yaml", "aleph_alpha": "aleph_alpha.yaml"}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
NAMED_TOOL = {"type": "function", "function": {"name": "get_weather"}}
JSON_SCHEMA_FORMAT = {
    "type": "json_schema",
    "json_schema": {
        "name": "city",
        "strict": True,
        "schema": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
            "required": ["city", "country"],
            "additionalProperties": False,
        },
    },
}
CONFIG = {
    "keys": [{"name": "corpus", "sha256": KEY_SHA}],
    "content_filter": {"input": {"words": ["forbidden-word"]}, "output": {"patterns": [r"secret-\d+"]}},
    "deployments": [
        {"name": "echo", "backend": "echo", "models": ["gpt-4o"]},
        {
            "name": "text-only",
            "backend": "echo",
            "capabilities": {"modalities": ["text"], "unsupported_parameters": ["tools", "logprobs"]},
        },
        *(
            {"name": f"limited-{d}", "backend": "echo", "limits": {"requests_per_minute": 1}}
            for d in CHAT_PATHS
        ),
    ],
}


@dataclass(frozen=True)
class Case:
    """One request of the corpus and what it must get."""

    dialect: str
    name: str
    body: dict[str, Any] | None = None  # the chat request's extra fields, or None for a GET
    status: int = 200
    path: str | None = None  # default: the dialect's chat path
    headers: dict[str, str] = field(default_factory=dict)
    with_key: bool = True
    kind: str = COMPLETION  # what a 200 JSON answer is
    repeat: int = 1  # send this many times, keep the last answer (to exhaust a limit)
    model: str = "echo"
    messages: tuple[dict[str, Any], ...] = ({"role": "user", "content": "Hello there, friend"},)

    @property
    def id(self) -> str:
        return f"{self.dialect}-{self.name}"

    def request(self) -> tuple[str, str, dict[str, Any] | None]:
        path = self.path or CHAT_PATHS[self.dialect]
        if self.body is None:
            return "GET", path, None
        return "POST", path, {"model": self.model, "messages": list(self.messages), **self.body}


def shared_cases(dialect: str) -> list[Case]:
    """What every one of the three dialects documents."""
    return [
        Case(dialect, "plain", {}),
        Case(dialect, "system-and-turns", {}, messages=(
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "How are you?"},
        )),
        Case(dialect, "stream", {"stream": True}),
        Case(dialect, "max-tokens-length", {"max_tokens": 2}),
        Case(dialect, "max-tokens-length-stream", {"max_tokens": 2, "stream": True}),
        Case(dialect, "stop", {"stop": ["friend"], "temperature": 0.5, "top_p": 0.9, "seed": 7}),
        Case(dialect, "content-filter-output", {}, messages=({"role": "user", "content": "Tell secret-42"},)),
        Case(dialect, "content-filter-output-stream", {"stream": True},
             messages=({"role": "user", "content": "Tell secret-42"},)),
        Case(dialect, "400-invalid-body", {"messages": "not a list"}, status=400),
        Case(dialect, "400-content-filter-input", {}, status=400,
             messages=({"role": "user", "content": "say forbidden-word"},)),
        Case(dialect, "400-extra-parameter", {"no_such_parameter": 1}, status=400),
        Case(dialect, "401-no-key", {}, status=401, with_key=False),
        Case(dialect, "401-wrong-key", {}, status=401, with_key=False,
             headers={"authorization": "Bearer wrong"}),
        Case(dialect, "429-requests-per-minute", {}, status=429, model=f"limited-{dialect}", repeat=2),
    ]  # fmt: skip


CASES = [
    *shared_cases("openai"),
    Case("openai", "stream-include-usage", {"stream": True, "stream_options": {"include_usage": True}}),
    Case("openai", "n", {"n": 2}),
    Case("openai", "n-stream-include-usage",
         {"n": 2, "stream": True, "stream_options": {"include_usage": True}}),
    Case("openai", "logprobs", {"logprobs": True, "top_logprobs": 3}),
    Case("openai", "logprobs-stream", {"logprobs": True, "top_logprobs": 3, "stream": True}),
    Case("openai", "tools", {"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False}),
    Case("openai", "tools-named-stream", {"tools": TOOLS, "tool_choice": NAMED_TOOL, "stream": True}),
    Case("openai", "legacy-functions", {"functions": [TOOLS[0]["function"]], "function_call": "auto"}),
    Case("openai", "json-object", {"response_format": {"type": "json_object"}}),
    Case("openai", "json-schema", {"response_format": JSON_SCHEMA_FORMAT, "max_completion_tokens": 50}),
    Case("openai", "json-schema-stream", {"response_format": JSON_SCHEMA_FORMAT, "stream": True}),
    Case("openai", "developer-role", {}, messages=(
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
    )),
    Case("openai", "404-unknown-model", {}, status=404, model="no-such-model"),
    Case("openai", "422-unsupported-parameter", {"logprobs": True}, status=422, model="text-only"),
    Case("openai", "models", kind="model_list", path="/v1/models"),
    Case("openai", "model", kind="model", path="/v1/models/echo"),
    Case("openai", "404-model", status=404, path="/v1/models/no-such-model"),
    *shared_cases("azure"),
    Case("azure", "tools", {"tools": TOOLS, "tool_choice": "required"}),
    Case("azure", "tools-named-stream", {"tools": TOOLS, "tool_choice": NAMED_TOOL, "stream": True}),
    Case("azure", "json-object", {"response_format": {"type": "json_object"}}),
    Case("azure", "json-schema", {"response_format": JSON_SCHEMA_FORMAT}),
    Case("azure", "json-schema-stream", {"response_format": JSON_SCHEMA_FORMAT, "stream": True}),
    Case("azure", "extra-parameters-drop", {"no_such_parameter": 1}, headers={"extra-parameters": "drop"}),
    Case("azure", "extra-parameters-pass-through", {"no_such_parameter": 1},
         headers={"extra-parameters": "pass-through"}),
    Case("azure", "deployment-header", {}, headers={"azureml-model-deployment": "echo"}),
    Case("azure", "404-unknown-deployment", {}, status=404, headers={"azureml-model-deployment": "nope"}),
    Case("azure", "422-unsupported-parameter", {"tools": TOOLS}, status=422, model="text-only"),
    Case("azure", "info", kind="model_info", path="/azure/info?api-version=2024-05-01-preview"),
    *shared_cases("aleph_alpha"),
    Case("aleph_alpha", "stream-include-usage", {"stream": True, "stream_options": {"include_usage": True}}),
    Case("aleph_alpha", "n", {"n": 2}),
    Case("aleph_alpha", "n-stream", {"n": 2, "stream": True}),
    Case("aleph_alpha", "logprobs", {"logprobs": True, "top_logprobs": 3}),
    Case("aleph_alpha", "logprobs-stream", {"logprobs": True, "top_logprobs": 2, "stream": True,
                                            "stream_options": {"include_usage": True}}),
    Case("aleph_alpha", "ignored-parameters", {"seed": 3, "user": "someone"}),
    Case("aleph_alpha", "404-unknown-model", {}, status=404, model="no-such-model"),
    Case("aleph_alpha", "400-rejected-parameter", {"tools": TOOLS}, status=400),
    Case("aleph_alpha", "422-unsupported-parameter", {"logprobs": True}, status=422, model="text-only"),
    Case("aleph_alpha", "400-message-order", {}, status=400, messages=(
        {"role": "assistant", "content": "I start."}, {"role": "user", "content": "Hi"},
    )),
]  # fmt: skip


@dataclass
class Answer:
    status: int
    headers: httpx.Headers
    bodies: list[tuple[str, Any]]  # (kind, parsed body), one per JSON body or stream chunk
    stream_done: bool = False


def parse(case: Case, response: httpx.Response) -> Answer:
    media_type = response.headers.get("content-type", "").split(";")[0]
    if media_type != "text/event-stream":
        kind = case.kind if response.status_code == 200 else ERROR
        return Answer(response.status_code, response.headers, [(kind, response.json())])
    payloads = [line[5:].strip() for line in response.text.splitlines() if line.startswith("data:")]
    bodies = []
    for payload in payloads:
        if payload != "[DONE]":
            chunk = orjson.loads(payload)
            bodies.append((ERROR if "error" in chunk and "choices" not in chunk else CHUNK, chunk))
    return Answer(response.status_code, response.headers, bodies, stream_done=payloads[-1:] == ["[DONE]"])


@pytest.fixture(scope="module")
def vendors(refspecs: Path) -> VendorSpecs:
    return VendorSpecs(refspecs)


@pytest.fixture(scope="module")
def answers(
    vendors: VendorSpecs, tmp_path_factory: pytest.TempPathFactory, log_dir: Path
) -> Iterator[dict[str, Answer]]:
    """Every case of the corpus, sent once to one gateway process."""
    config = tmp_path_factory.mktemp("vendor-specs") / "config.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    found: dict[str, Answer] = {}
    with running_gateway(log_dir, config) as base, httpx.Client(base_url=base, timeout=30) as client:
        for case in CASES:
            method, path, body = case.request()
            headers = {"authorization": f"Bearer {KEY}"} if case.with_key else {}
            headers.update(case.headers)
            for _ in range(case.repeat):
                response = client.request(method, path, json=body, headers=headers)
            found[case.id] = parse(case, response)
    yield found


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_answer_conforms_to_the_vendor_document(case: Case, answers: dict[str, Answer], vendors: VendorSpecs):
    answer = answers[case.id]
    assert answer.status == case.status, answer.bodies
    assert answer.bodies
    if case.body is not None and case.body.get("stream") and case.status == 200:
        assert answer.stream_done, "a stream ends with data: [DONE]"
        assert all(kind == CHUNK for kind, _ in answer.bodies), answer.bodies
    vendor = VENDOR_DOCUMENTS[case.dialect]
    for kind, body in answer.bodies:
        if kind in vendor.not_checked:
            continue
        errors = vendors.errors(case.dialect, kind, body)
        assert not errors, f"{kind} {body}: {errors}"
    if case.dialect == "azure" and case.status >= 400:
        assert answer.headers["x-ms-error-code"]  # Azure.Core's error contract, which we keep


def test_the_corpus_reaches_every_documented_feature(answers: dict[str, Answer]):
    """Guards the corpus itself: each feature shows up in what came back."""
    for dialect in CHAT_PATHS:
        bodies = [
            (kind, body)
            for case in CASES
            if case.dialect == dialect
            for kind, body in answers[case.id].bodies
        ]
        chunks = [b for kind, b in bodies if kind == CHUNK]
        completions = [b for kind, b in bodies if kind == COMPLETION and "choices" in b]
        finish = {c["finish_reason"] for b in completions + chunks for c in b["choices"]}
        assert {"stop", "length", "content_filter"} <= finish, (dialect, finish)
        statuses = {answers[case.id].status for case in CASES if case.dialect == dialect}
        assert {200, 400, 401, 404, 422, 429} <= statuses, (dialect, statuses)
        if dialect != "azure":  # Azure documents neither n, logprobs nor stream_options
            assert any(len(b["choices"]) == 2 for b in completions)
            assert any(c.get("logprobs") for b in completions + chunks for c in b["choices"])
            assert any(b["choices"] == [] and b.get("usage") for b in chunks), "usage-only last chunk"
        if dialect != "aleph_alpha":  # Aleph Alpha rejects tools and response_format
            assert "tool_calls" in finish
            assert any(c.get("delta", {}).get("tool_calls") for b in chunks for c in b["choices"])


def examples(media: dict[str, Any]) -> list[Any]:
    found = [media["example"]] if "example" in media else []
    return found + [example["value"] for example in media.get("examples", {}).values()]


def documented_bodies(dialect: str) -> list[tuple[str, Any]]:
    """The request, answer and chunk examples of the dialect's chat operation in openapi/."""
    operation = load_document(SPEC_FILES[dialect])["paths"]["/chat/completions"]["post"]
    answer = operation["responses"]["200"]["content"]
    events = examples(answer["text/event-stream"])
    return [
        *(("request", body) for body in examples(operation["requestBody"]["content"]["application/json"])),
        *((COMPLETION, body) for body in examples(answer["application/json"])),
        *((CHUNK, orjson.loads(event["data"])) for event in events if event["data"] != "[DONE]"),
    ]


@pytest.mark.parametrize("dialect", list(SPEC_FILES))
def test_our_documented_examples_are_valid_for_the_vendor(dialect: str, vendors: VendorSpecs):
    """The request, answer and chunk examples in openapi/ are valid for the vendor's document."""
    bodies = documented_bodies(dialect)
    assert {kind for kind, _ in bodies} == {"request", COMPLETION, CHUNK}
    for kind, body in bodies:
        errors = vendors.errors(dialect, kind, body)
        assert not errors, f"{kind} {body}: {errors}"


DEVIATIONS = [(vendor.dialect, d) for vendor in VENDOR_DOCUMENTS.values() for d in vendor.deviations]


@pytest.mark.parametrize("dialect, deviation", DEVIATIONS, ids=lambda v: getattr(v, "name", v))
def test_every_deviation_is_still_needed(
    dialect, deviation, answers: dict[str, Answer], vendors: VendorSpecs
):
    """Without the deviation, some answer of the corpus or some example of ours would be invalid
    for the vendor."""
    answered = [body for case in CASES if case.dialect == dialect for body in answers[case.id].bodies]
    broken = [
        (kind, body)
        for kind, body in answered + documented_bodies(dialect)
        if vendors.errors(dialect, kind, body, without=deviation.name)
    ]
    assert broken, f"{deviation.name} is no longer needed: remove it ({deviation.why})"


def test_vendor_documents_are_read_as_they_mean(vendors: VendorSpecs):
    aleph_alpha, dangling = vendor_schemas(vendors.refspecs_dir, "aleph_alpha")
    assert dangling == {"SteeringConceptRef"}  # not in the extract: accepts anything
    penalty = aleph_alpha["ChatRequest"]["properties"]["frequency_penalty"]
    assert (penalty["minimum"], penalty["maximum"]) == (-2, 2)  # stored as "-2", "2"
    assert vendors.errors("aleph_alpha", "request", {"model": "m", "messages": [], "frequency_penalty": 3})
    _openai, dangling = vendor_schemas(vendors.refspecs_dir, "openai")
    assert not dangling
    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    choice = {"index": 0, "delta": {"content": "x"}, "logprobs": None, "finish_reason": None}
    assert vendors.errors("openai", CHUNK, {**chunk, "choices": [choice]}) == []  # nullable: true
    assert vendors.errors("openai", CHUNK, {**chunk, "choices": [{**choice, "finish_reason": "done"}]})
    _azure, dangling = vendor_schemas(vendors.refspecs_dir, "azure")
    assert not dangling
