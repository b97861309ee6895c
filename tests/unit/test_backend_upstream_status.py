"""backends.http.status: an upstream's error answer → the client's, by each backend's table
(the openai-compatible backend's and TGI's, case by case, with no server)."""

from __future__ import annotations

from typing import Any

import pytest

from backends.http.status import CREDENTIALS, Answer, StatusTable, UpstreamFailure, status_error
from backends.openai_compatible import UPSTREAM_STATUSES, in_our_words
from backends.tgi.errors import STATUSES as TGI_STATUSES
from backends.tgi.errors import tgi_error
from gateway.core.errors import BadGateway, UpstreamRefused

SECRET = "sk-upstream-4711"

# upstream status → (client status, message, param, loc, Retry-After) for a failure that names
# `temperature` and sends Retry-After: 7 (the status decides what of it reaches the client)
OPENAI_CASES: list[tuple[int, tuple[int, str, Any, Any, Any]]] = [
    (400, (400, "bad", "temperature", ["body", "temperature"], None)),
    (401, (502, "The upstream model server refused the gateway's credentials (401).", None, None, None)),
    (403, (502, "The upstream model server refused the gateway's credentials (403).", None, None, None)),
    (404, (404, "bad", "temperature", None, None)),
    (409, (400, "bad", "temperature", None, None)),
    (422, (422, "bad", "temperature", ["body", "temperature"], None)),
    # its 429 words are about the gateway's account with it (quotas, plans): the client gets ours
    (
        429,
        (
            429,
            "The upstream model server is busy or its limits for the gateway are used up: try again later.",
            None,
            None,
            "7",
        ),
    ),
    (500, (502, "The upstream model server failed on this request (HTTP 500).", None, None, None)),
    (503, (503, "The upstream model server is busy (HTTP 503); try again later.", None, None, "7")),
]
TGI_CASES: list[tuple[int, tuple[int, str, Any, Any, Any]]] = [
    (400, (502, "TGI answered HTTP 400: bad", None, None, None)),
    (401, (502, "TGI refused the gateway's credentials (401).", None, None, None)),
    (408, (504, "TGI timed out: bad", None, None, None)),
    (413, (413, "TGI refused the request as too large: bad", None, None, None)),
    (422, (422, "TGI refused the request: bad", "temperature", ["body", "temperature"], None)),
    (424, (502, "TGI failed during generation: bad", None, None, None)),
    (429, (429, "TGI is overloaded: bad", None, None, "7")),
    (500, (502, "TGI failed on this request (HTTP 500).", None, None, None)),
    (503, (503, "TGI is unavailable (HTTP 503).", None, None, None)),
    (504, (504, "TGI timed out (HTTP 504).", None, None, None)),
]


@pytest.mark.parametrize(
    ("table", "status", "expected"),
    [(UPSTREAM_STATUSES, s, e) for s, e in OPENAI_CASES] + [(TGI_STATUSES, s, e) for s, e in TGI_CASES],
    ids=[f"openai-compatible-{s}" for s, _ in OPENAI_CASES] + [f"tgi-{s}" for s, _ in TGI_CASES],
)
def test_each_status_becomes_the_backends_answer(table: StatusTable, status: int, expected: tuple) -> None:
    error = status_error(table, UpstreamFailure(status, "bad", "temperature", "7"))
    assert (error.status, error.message, error.param, error.loc, error.headers.get("Retry-After")) == expected


@pytest.mark.parametrize("table", [UPSTREAM_STATUSES, TGI_STATUSES], ids=["openai-compatible", "tgi"])
@pytest.mark.parametrize("status", [401, 403])
def test_refused_credentials_are_a_502_that_repeats_nothing(table: StatusTable, status: int) -> None:
    error = status_error(table, UpstreamFailure(status, f"Incorrect API key provided: {SECRET}", "api_key"))
    assert isinstance(error, BadGateway) and error.status == 502
    assert isinstance(error, UpstreamRefused)  # never retried: another try presents the same key
    assert SECRET not in error.message and error.param is None and not error.headers


@pytest.mark.parametrize(
    "message",
    [
        # chatgate's own words, as another chatgate upstream says them
        "Extra parameters ['frobnicate', 'x'] are not allowed when 'extra-parameters' is 'error' "
        "(send 'extra-parameters: pass-through' or 'drop' to change this).",
        # Azure AI Model Inference's
        "Extra parameters ['frobnicate', 'x'] are not allowed when extra-parameters is not set or set "
        "to be 'error'. Set extra-parameters to 'pass-through' to pass to the model.",
    ],
)
def test_advice_only_the_gateway_could_follow_is_said_in_its_own_words(message: str) -> None:
    said = in_our_words(message, "frobnicate")
    assert said == "Extra parameters ['frobnicate', 'x'] are not allowed by the upstream model server."
    assert in_our_words("Unrecognized request argument supplied: x", "x").startswith("Unrecognized")


def test_tgi_says_overloaded_with_a_retry_after_of_its_own_and_names_the_parameter() -> None:
    overloaded = tgi_error(429, "Model is overloaded")
    assert overloaded.headers == {"Retry-After": "1"}
    invalid = tgi_error(422, "Input validation error: `max_new_tokens` must be strictly positive")
    assert invalid.param == "max_tokens" and invalid.code == "UpstreamValidationError"
    assert tgi_error(422, "Template error: roles must alternate").param == "messages"


def test_a_table_must_answer_credentials_and_every_other_status() -> None:
    with pytest.raises(ValueError, match="5xx"):
        StatusTable("X", {401: CREDENTIALS, 403: CREDENTIALS, "4xx": Answer(BadGateway)})
    with pytest.raises(ValueError, match="repeats the upstream's words"):
        StatusTable(
            "X", {401: CREDENTIALS, 403: CREDENTIALS, "4xx": Answer(BadGateway), "5xx": Answer(BadGateway)}
        )
    table = StatusTable(
        "X",
        {
            401: CREDENTIALS,
            403: CREDENTIALS,
            "4xx": Answer(BadGateway),
            "5xx": Answer(BadGateway, "X failed."),
        },
    )
    assert status_error(table, UpstreamFailure(418, "teapot")).message == "teapot"
    assert status_error(table, UpstreamFailure(500, "teapot")).message == "X failed."


TRACEBACK = (
    'Internal error: Traceback (most recent call last):\n  File "/srv/app/serve.py", line 88, in chat\n'
    "    raise ValueError(logit_bias)\nValueError: bad logit_bias"
)


@pytest.mark.parametrize("table", [UPSTREAM_STATUSES, TGI_STATUSES], ids=["openai-compatible", "tgi"])
@pytest.mark.parametrize("status", [500, 502, 503, 504])
def test_a_5xx_is_said_in_the_gateways_words_with_the_upstreams_request_id(table: StatusTable, status: int):
    error = status_error(table, UpstreamFailure(status, TRACEBACK, request_id="up-42"))
    assert (
        "Traceback" not in error.message
        and "/srv/app" not in error.message
        and "logit_bias" not in error.message
    )
    assert error.message.endswith("its request id: up-42.")


@pytest.mark.parametrize(
    ("said", "shown"),
    [
        (TRACEBACK, "Internal error"),
        ("model file /home/ops/models/llama.gguf not found", "model file <path> not found"),
        ("bad\x00value\x1b[31m here\u2028now", "bad value [31m here now"),
        ("see https://example.com/docs/errors for help", "see https://example.com/docs/errors for help"),
        ("x" * 400, "x" * 299 + "…"),
    ],
    ids=["traceback", "path", "control-characters", "url-kept", "bounded"],
)
def test_a_4xx_message_is_relayed_made_safe(said: str, shown: str):
    error = status_error(UPSTREAM_STATUSES, UpstreamFailure(400, said))
    assert error.status == 400 and error.message == shown


def test_a_token_tgi_quotes_is_not_relayed() -> None:
    import httpx2

    from backends.tgi.errors import error_for_response

    sent = {"authorization": "Bearer tgi-secret-4711"}
    request = httpx2.Request("POST", "http://tgi/generate", headers=sent)
    said = {"error": "Input validation error: token tgi-secret-4711 may not set `top_n_tokens`"}
    response = httpx2.Response(422, json=said, request=request)
    error = error_for_response(response)
    assert "tgi-secret-4711" not in error.message
    assert "may not set" in error.message
