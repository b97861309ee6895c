"""What chatgate answers, checked against the vendors' own documents (the refspecs, found as
tests/conftest.py says; every test here is skipped, with the way to get them, when there are none),
against the seeds where they say more, and against the dialects' own documents.

A real gateway process (keys, limits, a content filter, a text-only deployment) answers a
corpus of requests that touches every documented feature of every dialect: plain and streamed
answers, n, logprobs, tools, JSON output, include_usage, finish reasons, the errors
400/401/404/422/429, and the requests the seeds write that the vendors' documents do not (Azure's
content parts and tool messages, its api-version format; the rules between fields; Aleph Alpha's
official client's `maximum_tokens`; OVMS's and LMI's stream rules). Every completion, every stream
chunk and every error body is validated:

- against the vendor's schema for it (gateway/vendor_specs.py reads the documents once per
  session): OpenAI, Azure and Aleph Alpha; Azure's error bodies against the seed's error tables
  (`seed_errors`: the vendor's Azure.Core shape and the seed's flat bodies cannot both hold);
- against the dialect's own document with its objects closed: a field the document does not
  define is an error (the vendors' schemas leave their objects open, so they cannot see one);
- and, where the seed says something no schema can, against the case's own `check`.

Where chatgate answers differently from a vendor on purpose, the difference is a `Deviation` in
gateway/vendor_specs.py with its reason; `test_every_deviation_is_still_needed` fails when no
answer of the gateway (or, for a request schema, no request it answers) needs one any more: the
project's own examples do not count. The decisions are in gateway/vendor_specs.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml

from gateway.dialects import DEFAULT_MOUNTS
from gateway.dialects.registry import DIALECTS
from gateway.http.documents import load_document
from gateway.http.front_door import template_pattern
from gateway.policy.auth import new_key
from gateway.tools.vendor_specs import (
    CHUNK,
    COMPLETION,
    ERROR,
    VENDOR_DOCUMENTS,
    VendorSpecs,
    vendor_schemas,
)
from tests.support.documents import response_errors
from tests.support.readers import reader
from tests.support.servers import running_gateway
from tests.unit.dialects.cases import chunk_errors

KEY, KEY_SHA = new_key()
CHAT_PATHS = {
    "openai": "/v1/chat/completions",
    "azure": "/azure/chat/completions?api-version=2024-05-01-preview",
    "aleph_alpha": "/aleph-alpha/chat/completions",
    "lmi": "/lmi/v1/chat/completions",
    "ovms": "/v3/chat/completions",
}
SPEC_FILES = {name: dialect.document for name, dialect in DIALECTS.items()}
VENDOR_DIALECTS = [name for name in CHAT_PATHS if name in VENDOR_DOCUMENTS]
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
            "capabilities": {
                "modalities": ["text"],
                "unsupported_parameters": ["tools", "logprobs"],
                "parameter_ranges": {"temperature": {"maximum": 1}},
            },
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
    check: Callable[[Answer], None] | None = None  # what the seed says that no schema can
    method: str | None = None  # default: POST with a body, GET without

    @property
    def id(self) -> str:
        return f"{self.dialect}-{self.name}"

    def request(self) -> tuple[str, str, dict[str, Any] | None]:
        path = self.path or CHAT_PATHS[self.dialect]
        if self.body is None:
            return self.method or "GET", path, None
        return (
            self.method or "POST",
            path,
            {"model": self.model, "messages": list(self.messages), **self.body},
        )

    @property
    def document_path(self) -> tuple[str, str]:
        """(method, path) of the operation in the dialect's document."""
        method, path, _ = self.request()
        path = path.split("?")[0].removeprefix(DEFAULT_MOUNTS[self.dialect])
        chat = CHAT_PATHS[self.dialect].split("?")[0].removeprefix(DEFAULT_MOUNTS[self.dialect])
        documented = next(
            (p for p in documented_paths(self.dialect) if template_pattern(p).match(path)), path
        )
        return ("post" if method == "GET" and path == chat else method.lower()), documented


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


@cache
def documented_paths(dialect: str) -> tuple[str, ...]:
    return tuple(load_document(SPEC_FILES[dialect])["paths"])


def chunks_of(answer: Answer) -> list[dict[str, Any]]:
    return [body for kind, body in answer.bodies if kind == CHUNK]


def streamed_text(answer: Answer) -> str:
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks_of(answer) if c["choices"])


def the_only_body(answer: Answer) -> dict[str, Any]:
    ((_, body),) = answer.bodies
    return body


def says(answer: Answer, text: str) -> None:
    assert text in json.dumps(the_only_body(answer))


def function_call_answer(answer: Answer) -> None:
    (choice,) = the_only_body(answer)["choices"]
    assert choice["finish_reason"] == "function_call"
    assert (
        choice["message"]["function_call"]["name"] == "get_weather" and "tool_calls" not in choice["message"]
    )


def usage_null_until_the_usage_chunk(answer: Answer) -> None:
    *before, last = chunks_of(answer)
    assert last["choices"] == [] and last["usage"]
    assert all("usage" in c and c["usage"] is None for c in before)


def fingerprint_in_each_choices_last_chunk(answer: Answer) -> None:
    for chunk in chunks_of(answer):
        last = bool(chunk["choices"]) and chunk["choices"][0]["finish_reason"] is not None
        assert (chunk["system_fingerprint"] is not None) == last, chunk
        assert chunk["usage"] is None or not chunk["choices"]


def usage_on_the_last_chunk_only(answer: Answer) -> None:
    *before, last = chunks_of(answer)
    assert last["choices"] and last["choices"][0]["finish_reason"] and last["usage"]
    assert all("usage" not in c for c in before)


def stop_string_kept(answer: Answer) -> None:
    assert streamed_text(answer).endswith("friend")


def stop_string_cut(answer: Answer) -> None:
    (choice,) = the_only_body(answer)["choices"]
    assert not choice["message"]["content"].endswith("friend")


def no_id(answer: Answer) -> None:
    assert all("id" not in body for _, body in answer.bodies)


def finish_on_the_last_tokens_line(answer: Answer) -> None:
    lines = chunks_of(answer)
    finishing = [line for line in lines if line["choices"][0]["finish_reason"]]
    assert finishing == [lines[-1]] and lines[-1]["choices"][0]["delta"]["content"]


def no_logprobs(answer: Answer) -> None:
    assert all(choice["logprobs"] is None for choice in the_only_body(answer)["choices"])


SEED_AZURE_REQUEST = {  # the seed's own sample request, sent with the seed's api-version
    "messages": [
        {"role": "system", "content": "You are a helpful assistant"},
        {"role": "user", "content": "Explain Riemann's conjecture"},
        {"role": "assistant", "content": "The Riemann Conjecture is a deep mathematical conjecture."},
        {"role": "user", "content": "Ist it proved?"},
    ],
    "frequency_penalty": 0,
    "presence_penalty": 0,
    "max_tokens": 256,
    "seed": 42,
    "stop": "<|endoftext|>",
    "stream": False,
    "temperature": 0,
    "top_p": 1,
    "response_format": {"type": "text"},
}
AZURE_SEED_PATH = "/azure/chat/completions?api-version=2024-04-01-preview"
ASSISTANT_CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    ],
}
OVMS_NO_BEAM = {"model": "echo"}
USAGE_ASKED = {"include_usage": True}


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
    Case("openai", "legacy-functions-named", {"functions": [TOOLS[0]["function"]],
                                              "function_call": {"name": "get_weather"}},
         check=function_call_answer),
    Case("openai", "include-usage-nulls", {"stream": True, "stream_options": {"include_usage": True}},
         check=usage_null_until_the_usage_chunk),
    Case("openai", "400-top-logprobs-without-logprobs", {"top_logprobs": 2}, status=400),
    Case("openai", "400-stream-options-without-stream", {"stream_options": USAGE_ASKED}, status=400),
    Case("openai", "400-metadata-key-too-long", {"metadata": {"k" * 65: "v"}}, status=400),
    Case("openai", "400-logit-bias-key-not-a-token", {"logit_bias": {"abc": 1}}, status=400),
    Case("openai", "400-assistant-without-content", {}, status=400, messages=(
        {"role": "user", "content": "Hi"}, {"role": "assistant"}, {"role": "user", "content": "Again"},
    )),
    # the seed's literal function message (role "tool", a name, no tool_call_id): a copy slip of the
    # seed's (openai.yaml's reading), which neither OpenAI nor the gateway takes
    Case("openai", "400-seed-literal-function-message", {}, status=400, messages=(
        {"role": "user", "content": "Weather?"},
        {"role": "tool", "content": "22 degrees", "name": "get_weather"},
    )),
    Case("openai", "405-wrong-method", status=405, path="/v1/chat/completions", method="GET"),
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
    Case("azure", "usage-on-the-last-chunk", {"stream": True}, check=usage_on_the_last_chunk_only),
    Case("azure", "seed-example-request", SEED_AZURE_REQUEST, path=AZURE_SEED_PATH),
    Case("azure", "seed-content-parts", {}, messages=({"role": "user", "content": [
        {"type": "text", "content": "What is on it?"},
        {"type": "image", "content": "data:image/png;base64,iVBORw0KGgo=", "detail": "low"},
        {"type": "image_url", "content": "https://example.com/cat.png"},
    ]},)),
    Case("azure", "seed-system-parts", {}, messages=(
        {"role": "system", "content": [{"type": "text", "content": "Be brief."}]},
        {"role": "user", "content": "Hi"},
    )),
    Case("azure", "seed-tool-message-without-id", {}, messages=(
        {"role": "user", "content": "Weather?"}, ASSISTANT_CALL, {"role": "tool", "content": "22 degrees"},
    )),
    Case("azure", "model-decides-temperature", {"temperature": 3, "frequency_penalty": 5}),
    Case("azure", "422-value-the-model-cannot-honour", {"temperature": 1.5}, status=422, model="text-only",
         check=lambda a: says(a, '"loc": ["body", "temperature"]')),
    Case("azure", "400-api-version-format", {}, status=400,
         path="/azure/chat/completions?api-version=banana"),
    Case("azure", "405-wrong-method", status=405, path=CHAT_PATHS["azure"], method="GET"),
    *shared_cases("aleph_alpha"),
    Case("aleph_alpha", "stream-include-usage", {"stream": True, "stream_options": {"include_usage": True}}),
    Case("aleph_alpha", "n", {"n": 2}),
    Case("aleph_alpha", "n-stream", {"n": 2, "stream": True}),
    Case("aleph_alpha", "logprobs", {"logprobs": True, "top_logprobs": 3}),
    Case("aleph_alpha", "logprobs-stream", {"logprobs": True, "top_logprobs": 2, "stream": True,
                                            "stream_options": {"include_usage": True}}),
    Case("aleph_alpha", "ignored-parameters", {"seed": 3, "user": "someone"}),
    Case("aleph_alpha", "404-unknown-model", {}, status=404, model="no-such-model"),
    Case("aleph_alpha", "400-rejected-parameter", {"parallel_tool_calls": True}, status=400),
    Case("aleph_alpha", "tools-of-the-4.7.0-document", {"tools": TOOLS, "tool_choice": "required"},
         check=lambda a: says(a, '"finish_reason": "tool_calls"')),
    Case("aleph_alpha", "422-unsupported-parameter", {"logprobs": True}, status=422, model="text-only"),
    Case("aleph_alpha", "400-message-order", {}, status=400, messages=(
        {"role": "assistant", "content": "I start."}, {"role": "user", "content": "Hi"},
    )),
    Case("aleph_alpha", "stream-nulls", {"stream": True, "n": 2, "stream_options": {"include_usage": True}},
         check=fingerprint_in_each_choices_last_chunk),
    Case("aleph_alpha", "maximum-tokens-of-the-official-client", {"maximum_tokens": 2},
         check=lambda a: says(a, '"finish_reason": "length"')),
    Case("aleph_alpha", "400-both-token-limits", {"max_tokens": 2, "maximum_tokens": 2}, status=400),
    Case("aleph_alpha", "405-wrong-method", status=405, path=CHAT_PATHS["aleph_alpha"], method="GET"),
    # LMI and OVMS: no vendor document; their own documents and seeds
    Case("lmi", "plain", {}),
    Case("lmi", "stream", {"stream": True, "stop": ["friend"]}, check=finish_on_the_last_tokens_line),
    Case("lmi", "logprobs-only-with-top-logprobs", {"logprobs": True}, check=no_logprobs),
    Case("lmi", "logprobs-stream", {"logprobs": True, "top_logprobs": 2, "stream": True}),
    Case("lmi", "401-no-key", {}, status=401, with_key=False),
    Case("lmi", "405-wrong-method", status=405, path=CHAT_PATHS["lmi"], method="GET"),
    Case("ovms", "plain", OVMS_NO_BEAM, check=no_id),
    Case("ovms", "stream-include-usage", {"stream": True, "stream_options": {"include_usage": True}},
         check=usage_null_until_the_usage_chunk),
    Case("ovms", "stream-keeps-the-stop-string", {"stream": True, "stop": ["friend"]},
         check=stop_string_kept),
    Case("ovms", "whole-cuts-the-stop-string", {"stop": ["friend"]}, check=stop_string_cut),
    Case("ovms", "n-with-best-of", {"n": 2, "best_of": 2}),
    Case("ovms", "400-logprobs-streamed", {"logprobs": True, "stream": True}, status=400),
    Case("ovms", "400-best-of-streamed", {"best_of": 2, "stream": True}, status=400),
    Case("ovms", "stream-best-of-default", {"best_of": 1, "stream": True}),  # the default: no value
    Case("ovms", "400-n-above-best-of", {"n": 2}, status=400),
    Case("ovms", "400-n-streamed", {"n": 2, "stream": True}, status=400),
    Case("ovms", "400-stream-options-without-stream", {"stream_options": USAGE_ASKED}, status=400),
    Case("ovms", "400-stop-string-cut-in-a-stream", {"stream": True, "include_stop_str_in_output": False},
         status=400),
    Case("ovms", "400-both-speculative-knobs",
         {"num_assistant_tokens": 2, "assistant_confidence_threshold": 0.5}, status=400),
    Case("ovms", "400-image-not-one-of-the-forms", {}, status=400, messages=({"role": "user", "content": [
        {"type": "text", "text": "What is it?"},
        {"type": "image_url", "image_url": {"url": "../../etc/passwd"}},
    ]},)),
    Case("ovms", "403-image-from-a-private-address", {}, status=403, messages=({"role": "user", "content": [
        {"type": "text", "text": "What is it?"}, {"type": "image_url", "image_url": {"url": "http://127.0.0.1/x"}},
    ]},)),
    Case("ovms", "401-no-key", {}, status=401, with_key=False),
]  # fmt: skip


@dataclass
class Answer:
    status: int
    headers: httpx.Headers
    bodies: list[tuple[str, Any]]  # (kind, parsed body), one per JSON body or stream chunk
    stream_done: bool = False


def parse(case: Case, response: httpx.Response) -> Answer:
    media_type = response.headers.get("content-type", "").split(";")[0]
    if media_type == "application/jsonlines":
        lines = [orjson.loads(line) for line in response.text.splitlines() if line.strip()]
        bodies = [(CHUNK if "choices" in line else ERROR, line) for line in lines]
        return Answer(response.status_code, response.headers, bodies, stream_done=True)
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


def own_document_errors(case: Case, kind: str, status: int, body: Any) -> list[str]:
    """How a body breaks the dialect's own document, a field it does not define included."""
    spec = SPEC_FILES[case.dialect]
    method, path = case.document_path
    if kind == CHUNK:
        return chunk_errors(spec, path, body)
    return response_errors(spec, path, method, status, body)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_answer_conforms_to_the_vendor_document(case: Case, answers: dict[str, Answer], vendors: VendorSpecs):
    answer = answers[case.id]
    assert answer.status == case.status, answer.bodies
    assert answer.bodies
    if case.body is not None and case.body.get("stream") and case.status == 200:
        assert answer.stream_done, "a stream ends with data: [DONE]"
        assert all(kind == CHUNK for kind, _ in answer.bodies), answer.bodies
    for kind, body in answer.bodies:
        errors = vendors.errors(case.dialect, kind, body, status=answer.status)
        assert not errors, f"{kind} {body}: {errors}"
        errors = own_document_errors(case, kind, answer.status, body)
        assert not errors, f"{kind} {body} breaks {SPEC_FILES[case.dialect]}: {errors}"
    if case.dialect == "azure" and case.status >= 400:
        assert answer.headers["x-ms-error-code"]  # Azure.Core's error contract, which we keep
    if case.check is not None:
        case.check(answer)


def test_the_corpus_reaches_every_documented_feature(answers: dict[str, Answer]):
    """Guards the corpus itself: each feature shows up in what came back (the features of OpenAI's
    chat: a dialect whose answers have no `choices` needs a corpus check of its own)."""
    for dialect in [name for name in VENDOR_DIALECTS if reader(name).chat_shaped]:
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


@pytest.mark.parametrize("dialect", VENDOR_DIALECTS)
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
    """Without the deviation, some answer of the gateway would be invalid for the vendor (for a
    request schema: some request of the corpus the gateway answers). The project's own examples
    are no evidence: they are written to the deviations."""
    evidence = [
        (kind, body, answers[case.id].status)
        for case in CASES
        if case.dialect == dialect
        for kind, body in answers[case.id].bodies
    ]
    evidence += [
        ("request", case.request()[2], 200)
        for case in CASES
        if case.dialect == dialect and case.status == 200 and case.body is not None
    ]
    broken = [
        (kind, body)
        for kind, body, status in evidence
        if vendors.errors(dialect, kind, body, without=deviation.name, status=status)
        and not vendors.errors(dialect, kind, body, status=status)
    ]
    assert broken, f"{deviation.name} is no longer needed by any answer: remove it ({deviation.why})"


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
