"""Gateway policy, table-driven: each dialect × each refusal, with status, body shape (checked
against the dialect's own document) and headers asserted."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gateway.dialects.registry import DIALECTS as REGISTRY
from gateway.http.documents import DialectSpec, load_document
from gateway.policy.auth import new_key
from tests.support.dialect_routes import ChatRoute, main_routes
from tests.support.documents import response_errors
from tests.support.readers import ChatReader, reader
from tests.support.servers import running_gateway

KEY, KEY_SHA = new_key()
TEXT_ONLY_KEY, TEXT_ONLY_SHA = new_key()
PROMPT = "Say something nice please"
FILTERED_OUTPUT_PROMPT = "Say something about secret-42 please"
LONG_PROMPT = "word " * 400  # about 500 estimated tokens


@dataclass(frozen=True)
class Dialect:
    name: str
    spec_file: str
    doc_path: str
    url_path: str
    unsupported: dict[str, Any]  # a parameter the text-only deployment does not take, first
    filtered_finish: str  # what content_filter reads as in this dialect
    image_part: dict[str, Any] = field(
        default_factory=lambda: {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    )

    @property
    def reader(self) -> ChatReader:
        return reader(self.name)

    def body(self, model: str, content: Any = PROMPT, **extra: Any) -> dict[str, Any]:
        return self.reader.body(content, model, **extra)


# what the text-only deployment refuses; each dialect is tried with the first it defines (and
# what that parameter needs beside it to mean something: LMI returns logprobs only with a
# positive top_logprobs)
TEXT_ONLY_REFUSES = {
    "tools": {"tools": [{"type": "function", "function": {"name": "f"}}]},
    "logprobs": {"logprobs": True, "top_logprobs": 1},
    "top_k": {"top_k": 5},
}


def dialect_under_test(route: ChatRoute) -> Dialect:
    registered = REGISTRY[route.dialect]
    spec = DialectSpec(load_document(registered.document), frozenset(registered.chat_operations))
    # one the dialect defines and takes (not one its own document refuses)
    takes = spec.chat_fields - set(spec.unsupported)
    refused = next(name for name in TEXT_ONLY_REFUSES if name in takes)
    return Dialect(
        route.dialect,
        route.document,
        route.doc_path,
        route.url,
        TEXT_ONLY_REFUSES[refused],
        registered.translator.finish_reasons["content_filter"],
    )


DIALECTS = [dialect_under_test(route) for route in main_routes().values()]

CONFIG = {
    "server": {"max_body_bytes": 4096},
    "keys": [
        {"name": "everything", "sha256": KEY_SHA},
        {"name": "text-only", "sha256": TEXT_ONLY_SHA, "deployments": ["text-only"]},
    ],
    "content_filter": {
        "input": {"words": ["forbidden-word"]},
        "output": {"patterns": [r"secret-\d+"]},
    },
    "deployments": [
        {"name": "echo", "backend": "echo"},
        {
            "name": "text-only",
            "backend": "echo",
            "capabilities": {
                "modalities": ["text"],
                "unsupported_parameters": ["tools", "logprobs", "top_k"],
                "parameter_ranges": {"temperature": {"maximum": 0.8}},  # below every document's
            },
        },
        {"name": "one-per-minute", "backend": "echo", "limits": {"requests_per_minute": 1}},
        {"name": "few-tokens", "backend": "echo", "limits": {"tokens_per_minute": 100}},
        {"name": "open-extras", "backend": "echo", "extra_parameters": "pass-through"},
    ],
}


@pytest.fixture(scope="module", params=DIALECTS, ids=lambda d: d.name)
def dialect(request) -> Dialect:
    return request.param


@pytest.fixture(scope="module")
def url(dialect: Dialect, tmp_path_factory, log_dir: Path) -> Iterator[str]:
    config = tmp_path_factory.mktemp("policy") / "config.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    with running_gateway(log_dir, config) as base:
        yield base


def post(url: str, dialect: Dialect, body: dict, key: str | None = KEY, **headers: str) -> httpx.Response:
    if key is not None:
        headers["authorization"] = f"Bearer {key}"
    return httpx.post(f"{url}{dialect.url_path}", json=body, headers=headers, timeout=30)


def assert_error(response: httpx.Response, dialect: Dialect, status: int) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["x-request-id"]
    body = response.json()
    assert response_errors(dialect.spec_file, dialect.doc_path, "post", status, body) == []
    if dialect.name == "azure":
        assert response.headers["x-ms-error-code"]
    return body


def message_text(dialect: Dialect, body: dict) -> str:
    return dialect.reader.text(body)


def test_no_credentials_is_401(url, dialect):
    assert_error(post(url, dialect, dialect.body("echo"), key=None), dialect, 401)


def test_wrong_key_is_401(url, dialect):
    assert_error(post(url, dialect, dialect.body("echo"), key="cg-not-a-key"), dialect, 401)


def test_api_key_header_works_too(url, dialect):
    """The key in the header the document's apiKey scheme names (`api-key`; Anthropic's `x-api-key`)."""
    schemes = load_document(dialect.spec_file)["components"]["securitySchemes"]
    (header,) = (s["name"] for s in schemes.values() if s["type"] == "apiKey")
    response = post(url, dialect, dialect.body("echo"), key=None, **{header: KEY})
    assert response.status_code == 200


def test_key_limited_to_other_deployments(url, dialect):
    body = assert_error(
        post(url, dialect, dialect.body("echo"), key=TEXT_ONLY_KEY),
        dialect,
        404 if dialect.name in ("openai", "azure") else 403,
    )
    assert TEXT_ONLY_KEY not in str(body)
    assert post(url, dialect, dialect.body("text-only"), key=TEXT_ONLY_KEY).status_code == 200


def test_extra_parameter_pass_through(url, dialect):
    response = post(url, dialect, dialect.body("echo", mood="calm"), **{"extra-parameters": "pass-through"})
    assert response.status_code == 200
    assert '[extra parameters: {"mood":"calm"}]' in message_text(dialect, response.json())


def test_extra_parameter_pass_through_by_deployment_default(url, dialect):
    response = post(url, dialect, dialect.body("open-extras", mood="calm"))
    assert '{"mood":"calm"}' in message_text(dialect, response.json())


@pytest.mark.parametrize("value", ["drop", "ignore"])
def test_extra_parameter_drop(url, dialect, value):
    response = post(url, dialect, dialect.body("echo", mood="calm"), **{"extra-parameters": value})
    assert response.status_code == 200
    assert "extra parameters" not in message_text(dialect, response.json())


@pytest.mark.parametrize("header", [{"extra-parameters": "error"}, {}])
def test_extra_parameter_error(url, dialect, header):
    body = assert_error(post(url, dialect, dialect.body("echo", mood="calm", tone=1), **header), dialect, 400)
    assert "mood" in str(body) and "tone" in str(body)


def test_bad_extra_parameters_header(url, dialect):
    body = assert_error(
        post(url, dialect, dialect.body("echo"), **{"extra-parameters": "bogus"}), dialect, 400
    )
    for valid in ("pass-through", "drop", "error"):
        assert valid in str(body)


def test_unknown_model_is_404(url, dialect):
    assert_error(post(url, dialect, dialect.body("no-such-model")), dialect, 404)


def test_unsupported_modality_is_404(url, dialect):
    content = [{"type": "text", "text": "what is this?"}, dialect.image_part]
    body = assert_error(post(url, dialect, dialect.body("text-only", content=content)), dialect, 404)
    assert "Modality not supported by the model" in str(body)


def test_unsupported_parameter_is_422(url, dialect):
    name = next(iter(dialect.unsupported))
    body = assert_error(post(url, dialect, dialect.body("text-only", **dialect.unsupported)), dialect, 422)
    assert name in str(body)
    if dialect.name == "azure":
        assert body["detail"]["loc"] == ["body", name]


def test_a_value_outside_the_models_range_is_422(url, dialect):
    """Within the document's range (Azure's has no maximum: the seed says the model answers 422)
    but above what the deployment's model takes."""
    body = assert_error(post(url, dialect, dialect.body("text-only", temperature=0.9)), dialect, 422)
    assert "temperature" in str(body)
    if dialect.name == "azure":
        assert body["detail"] == {"loc": ["body", "temperature"], "value": "0.9"}
    within = post(url, dialect, dialect.body("text-only", temperature=0.5))
    assert within.status_code == 200, within.text


def test_requests_per_minute_is_429(url, dialect):
    first = post(url, dialect, dialect.body("one-per-minute"))
    assert first.status_code == 200
    assert first.headers["x-ratelimit-limit-requests"] == "1"
    assert first.headers["x-ratelimit-remaining-requests"] == "0"
    second = post(url, dialect, dialect.body("one-per-minute"))
    assert_error(second, dialect, 429)
    assert 1 <= int(second.headers["retry-after"]) <= 60
    assert second.headers["x-ratelimit-remaining-requests"] == "0"


def test_tokens_per_minute_is_429(url, dialect):
    """A prompt that fits the limit waits for room (Retry-After); one larger than the whole
    limit is told it is too large, without a Retry-After: no wait lets it through (issue 28)."""
    fits = dialect.body("few-tokens", content=LONG_PROMPT[:200])
    for _ in range(5):
        response = post(url, dialect, fits)
        if response.status_code == 429:
            break
    assert_error(response, dialect, 429)
    assert int(response.headers["retry-after"]) >= 1
    assert response.headers["x-ratelimit-limit-tokens"] == "100"
    too_large = post(url, dialect, dialect.body("few-tokens", content=LONG_PROMPT[:1000]))
    assert_error(too_large, dialect, 429)
    assert "retry-after" not in too_large.headers
    assert too_large.headers["x-ratelimit-limit-tokens"] == "100"


def test_content_filter_on_the_prompt(url, dialect):
    body = assert_error(
        post(url, dialect, dialect.body("echo", content="a forbidden-word here")), dialect, 400
    )
    if dialect.name == "azure":
        assert body["code"] == "content_filter" and body["param"] == "messages"


def test_content_filter_on_the_completion(url, dialect):
    response = post(url, dialect, dialect.body("echo", content=FILTERED_OUTPUT_PROMPT))
    assert response.status_code == 200
    body = response.json()
    assert dialect.reader.finish(body) == dialect.filtered_finish
    assert "secret-42" not in message_text(dialect, body)
    assert response_errors(dialect.spec_file, dialect.doc_path, "post", 200, body) == []


def test_content_filter_ends_a_stream_cleanly(url, dialect):
    with httpx.stream(
        "POST", f"{url}{dialect.url_path}",
        json=dialect.body("echo", content=FILTERED_OUTPUT_PROMPT, stream=True),
        headers={"authorization": f"Bearer {KEY}"}, timeout=30,
    ) as response:  # fmt: skip
        lines = list(response.iter_lines())
    assert response.status_code == 200
    assert "secret-42" not in "\n".join(lines)
    assert dialect.reader.streamed_finish(dialect.reader.events(lines)) == dialect.filtered_finish


def test_body_over_the_limit_is_413(url, dialect):
    assert_error(post(url, dialect, dialect.body("echo", content="x" * 5000)), dialect, 413)


def test_health_and_specs_stay_open(url, dialect):
    assert httpx.get(f"{url}/health").status_code == 200
    mount = dialect.url_path.split("/")[1]
    assert httpx.get(f"{url}/{mount}/openapi.json").status_code == 200


@pytest.fixture(scope="module")
def listing_gateway(tmp_path_factory, log_dir: Path) -> Iterator[str]:
    config = tmp_path_factory.mktemp("listing") / "config.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    with running_gateway(log_dir, config) as base:
        yield base


def test_model_listing_shows_what_the_key_may_use(listing_gateway):
    def listed(key: str) -> list[str]:
        answer = httpx.get(f"{listing_gateway}/v1/models", headers={"authorization": f"Bearer {key}"})
        assert answer.status_code == 200
        return [model["id"] for model in answer.json()["data"]]

    everything = [deployment["name"] for deployment in CONFIG["deployments"]]
    assert listed(KEY) == everything
    assert listed(TEXT_ONLY_KEY) == ["text-only"]


def test_a_model_hidden_from_the_key_reads_as_missing(listing_gateway):
    def retrieve(model: str, key: str) -> httpx.Response:
        return httpx.get(f"{listing_gateway}/v1/models/{model}", headers={"authorization": f"Bearer {key}"})

    assert retrieve("echo", KEY).json()["id"] == "echo"
    assert retrieve("text-only", TEXT_ONLY_KEY).json()["id"] == "text-only"
    hidden, missing = retrieve("echo", TEXT_ONLY_KEY), retrieve("no-such-model", TEXT_ONLY_KEY)
    assert hidden.status_code == missing.status_code == 404
    assert hidden.json()["error"]["code"] == missing.json()["error"]["code"] == "model_not_found"


def test_azure_model_info_is_for_deployments_the_key_may_use(listing_gateway):
    def info(deployment: str, key: str) -> httpx.Response:
        headers = {"authorization": f"Bearer {key}", "azureml-model-deployment": deployment}
        return httpx.get(f"{listing_gateway}/azure/info?api-version=2024-05-01-preview", headers=headers)

    assert info("text-only", TEXT_ONLY_KEY).status_code == 200
    refused = info("echo", TEXT_ONLY_KEY)
    assert refused.status_code == 404 and refused.headers["x-ms-error-code"]
    assert info("echo", KEY).status_code == 200
