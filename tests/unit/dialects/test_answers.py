"""Every dialect's translator against its own rows, one test per kind of row: bodies read as the
canonical request, completions, what the backend said of the answer, finish words, streams and
errors, each held to the dialect's document. The rows live in the dialect's module
(`test_<dialect>.py`, its `TABLES`); the tests that only one dialect has stay there too. Where
every dialect answers alike but in its own words (finish reasons, most gateway errors), the rows
are here, one table with a column per dialect.

A dialect with no module of its own that reuses another's translator (as the README's sixth
dialect reuses OVMS's) borrows that dialect's rows, held to its own document; any other fails
here, naming itself."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from gateway.core.canonical import Choice, Completion, Finish, FinishReason
from gateway.core.errors import GatewayError
from gateway.dialects.registry import DIALECTS
from tests.support.documents import response_errors
from tests.support.readers import reader
from tests.unit.dialects import cases
from tests.unit.dialects.cases import (
    MINIMAL_BODY,
    USAGE,
    AnswerCase,
    CompletionCase,
    DialectTables,
    ErrorCase,
    ReadCase,
    RefusedCase,
    StreamCase,
)


def own_tables(dialect: str) -> DialectTables | None:
    """The rows of the dialect's own module, if it has one."""
    if importlib.util.find_spec(f"tests.unit.dialects.test_{dialect}") is None:
        return None
    tables = getattr(importlib.import_module(f"tests.unit.dialects.test_{dialect}"), "TABLES", None)
    assert isinstance(tables, DialectTables), f"{dialect}: test_{dialect}.py declares no TABLES"
    assert tables.dialect == dialect
    return tables


def lender(dialect: str, has: Callable[[str], bool]) -> str:
    """The dialect itself where `has` it; else the one whose translator it reuses (its class, or
    the nearest ancestor of it, as a registered dialect's translator) that `has` it."""
    if has(dialect):
        return dialect
    for cls in DIALECTS[dialect].translator.__mro__:
        for other, registered in DIALECTS.items():
            if registered.translator is cls and has(other):
                return other
    raise AssertionError(
        f"{dialect}: no rows of its own (tests/unit/dialects/test_{dialect}.py) nor a lender's"
    )


def tables_of(dialect: str) -> DialectTables:
    """The dialect's own rows; or, for a dialect with no module that reuses another's translator,
    that dialect's rows held to its own document."""
    tables = own_tables(lender(dialect, lambda name: own_tables(name) is not None))
    assert tables is not None
    return replace(tables, dialect=dialect, spec=DIALECTS[dialect].document)


TABLES = {name: tables_of(name) for name in DIALECTS}


def column(table: dict[str, Any], dialect: str) -> Any:
    """The dialect's entry in a table indexed by dialect (or its lender's)."""
    return table[lender(dialect, lambda name: name in table)]


def rows(table: Callable[[DialectTables], Iterable[Any]]) -> list[Any]:
    """Every dialect's rows of one table, each with its dialect, id'd `dialect: row`."""
    found = []
    for name, tables in TABLES.items():
        for row in table(tables):
            marks = getattr(row, "marks", ())
            case = getattr(row, "values", (row,))[0]
            found.append(pytest.param(name, case, marks=marks, id=f"{name}: {case.id}"))
    return found


def document_errors(dialect: str, status: int, body: Any) -> list[str]:
    tables = TABLES[dialect]
    return [e for path in tables.paths for e in response_errors(tables.spec, path, "post", status, body)]


# ----- read -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("dialect", "case"), rows(lambda t: t.reads))
def test_read(dialect: str, case: ReadCase):
    assert cases.translator(dialect).read({**MINIMAL_BODY, **case.body}) == cases.request(**case.expected)


@pytest.mark.parametrize(("dialect", "case"), rows(lambda t: t.refused))
def test_refused(dialect: str, case: RefusedCase):
    translator = cases.translator(dialect)
    with pytest.raises(case.error) as raised:
        translator.read({**MINIMAL_BODY, **case.body})
    error = raised.value
    assert (error.code, error.param, error.loc, error.value) == (case.code, case.param, case.loc, case.value)
    rendered = translator.error(error, "request-1")
    assert rendered.status == error.status
    assert document_errors(dialect, rendered.status, rendered.body) == []


@pytest.mark.parametrize("dialect", DIALECTS)
def test_every_parameter_the_document_defines_has_a_row(dialect: str):
    tables = TABLES[dialect]
    assert cases.parameters_in(tables.reads, tables.refused) >= cases.translator(dialect).facts.fields


# ----- completion -------------------------------------------------------------------------------


@pytest.mark.parametrize(("dialect", "case"), rows(lambda t: t.completions))
def test_completion(dialect: str, case: CompletionCase):
    body = cases.translator(dialect).completion(cases.answer(**case.request), Completion(case.choices, USAGE))
    assert body == cases.completion_body(case.expected, without=TABLES[dialect].completion_without)
    if case.checked_against_document:
        assert document_errors(dialect, 200, body) == []


@pytest.mark.parametrize(("dialect", "case"), rows(lambda t: t.answers))
def test_what_the_backend_said_of_the_answer(dialect: str, case: AnswerCase):
    choices = [Choice(0, "Hi", finish_reason="stop")]
    body = cases.translator(dialect).completion(cases.answer(), Completion(choices, case.usage, case.served))
    assert {k: v for k, v in body.items() if k not in ("id", "object", "created", "model", "choices")} == (
        case.expected
    )
    assert document_errors(dialect, 200, body) == []


# Each canonical finish reason in each dialect's words, whole and streamed. Aleph Alpha's 4.7.0
# document takes tools, and its service (and client) end such an answer with tool_calls; OVMS
# documents only stop and length; LMI's are eos_token, stop_sequence and length.
FINISH_WORDS: dict[FinishReason, dict[str, str]] = {
    "stop": {
        "openai": "stop",
        "azure": "stop",
        "aleph_alpha": "stop",
        "lmi": "eos_token",
        "ovms": "stop",
        "anthropic": "end_turn",
    },
    "stop_sequence": {
        "openai": "stop",
        "azure": "stop",
        "aleph_alpha": "stop",
        "lmi": "stop_sequence",
        "ovms": "stop",
        "anthropic": "stop_sequence",
    },
    "length": {
        "openai": "length",
        "azure": "length",
        "aleph_alpha": "length",
        "lmi": "length",
        "ovms": "length",
        "anthropic": "max_tokens",
    },
    "tool_calls": {
        "openai": "tool_calls",
        "azure": "tool_calls",
        "aleph_alpha": "tool_calls",
        "lmi": "eos_token",
        "ovms": "stop",
        "anthropic": "tool_use",
    },
    "content_filter": {
        "openai": "content_filter",
        "azure": "content_filter",
        "aleph_alpha": "content_filter",
        "lmi": "stop_sequence",
        "ovms": "stop",
        "anthropic": "refusal",
    },
}


@pytest.mark.parametrize("reason", FINISH_WORDS)
@pytest.mark.parametrize("dialect", DIALECTS)
def test_finish_reason_words(dialect: str, reason: FinishReason):
    translator, said = cases.translator(dialect), reader(dialect)
    body = translator.completion(cases.answer(), Completion([Choice(0, "x", finish_reason=reason)], USAGE))
    # Azure closes a stream on the usage chunk, which carries the finish; no other dialect
    # sends usage not asked for
    chunks = cases.stream(translator, [Finish(0, reason), USAGE])
    if said.chat_shaped:  # the finish in one chunk
        assert len(chunks) == 1
    assert said.finish(body) == said.streamed_finish(chunks) == column(FINISH_WORDS[reason], dialect)


# ----- chunks -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("dialect", "case"), rows(lambda t: t.streams))
def test_stream(dialect: str, case: StreamCase):
    tables = TABLES[dialect]
    chunks = cases.stream(
        cases.translator(dialect), case.events, include_usage=case.include_usage, **case.request
    )
    assert chunks == case.expected
    for each in chunks:
        for path in tables.paths:
            assert cases.chunk_errors(tables.spec, path, each) == []


# ----- error ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SharedError:
    """A gateway error every dialect answers with the same status and headers, and each dialect's
    words for it: what its TABLES.error_body writes the body from (OpenAI: type, param and code;
    Azure: the code it describes and the fields beside it; Aleph Alpha: its code; LMI: DJL's
    exception; OVMS: nothing, its body is the message)."""

    id: str
    error: GatewayError
    status: int
    words: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
    statuses: dict[str, int] = field(default_factory=dict)  # a dialect's own status for it


INVALID = "invalid_request_error"
SHARED_ERRORS = [
    SharedError(
        "400 invalid body names its param",
        cases.INVALID_BODY,
        400,
        {
            "openai": (INVALID, "messages[0].content", "BadRequest"),
            "azure": ("BadRequest", {"code": "BadRequest", "param": "messages[0].content"}),
            "aleph_alpha": "BAD_REQUEST",
            "lmi": "BadRequestException",
            "ovms": None,
            "anthropic": ("invalid_request_error", "messages.0.content: 5 is not of type 'string'"),
        },
    ),
    SharedError(
        "400 without a parameter has no param",
        cases.NOT_JSON,
        400,
        {
            "openai": (INVALID, None, "BadRequest"),
            "azure": ("BadRequest", {"code": "BadRequest"}),
            "aleph_alpha": "BAD_REQUEST",
            "lmi": "BadRequestException",
            "ovms": None,
            "anthropic": "invalid_request_error",
        },
    ),
    SharedError(
        "400 extra parameter",
        cases.EXTRA_PARAMETER,
        400,
        {
            "openai": (INVALID, "mood", "ExtraParameterNotAllowed"),
            "azure": ("ExtraParameterNotAllowed", {"code": "ExtraParameterNotAllowed", "param": "mood"}),
            "aleph_alpha": "EXTRA_PARAMETER_NOT_ALLOWED",
            "lmi": "BadRequestException",
            "ovms": None,
            "anthropic": ("invalid_request_error", "mood: " + cases.EXTRA_PARAMETER.message),
        },
    ),
    SharedError(
        "400 content filter (Aleph Alpha: a snake_case code in capitals)",
        cases.PROMPT_FILTERED,
        400,
        {
            "openai": (INVALID, "messages", "content_filter"),
            "azure": ("content_filter", {"code": "content_filter", "param": "messages"}),
            "aleph_alpha": "CONTENT_FILTER",
            "lmi": "BadRequestException",
            "ovms": None,
            "anthropic": ("invalid_request_error", "messages: " + cases.PROMPT_FILTERED.message),
        },
    ),
    SharedError(
        "401 (Azure: no code in the body)",
        cases.NO_KEY,
        401,
        {
            "openai": ("authentication_error", None, "Unauthorized"),
            "azure": ("Unauthorized", {}),
            "aleph_alpha": "UNAUTHORIZED",
            "lmi": "UnauthorizedException",
            "ovms": None,
            "anthropic": "authentication_error",
        },
    ),
    SharedError(
        "404 unknown model (Azure: no code in the body)",
        cases.UNKNOWN_MODEL,
        404,
        {
            "openai": ("not_found_error", "model", "ModelNotFound"),
            "azure": ("ModelNotFound", {}),
            "aleph_alpha": "MODEL_NOT_FOUND",
            "lmi": "ModelNotFoundException",
            "ovms": None,
            "anthropic": "not_found_error",
        },
    ),
    SharedError(
        "405 with Allow",
        cases.WRONG_METHOD,
        405,
        {
            "openai": (INVALID, None, "MethodNotAllowed"),
            "azure": ("MethodNotAllowed", {"code": "MethodNotAllowed"}),
            "aleph_alpha": "METHOD_NOT_ALLOWED",
            "lmi": "BadRequestException",
            "ovms": None,
            "anthropic": "invalid_request_error",
        },
        {"Allow": "POST"},
    ),
    SharedError(
        "413",
        cases.BODY_TOO_LARGE,
        413,
        {
            "openai": (INVALID, None, "PayloadTooLarge"),
            "azure": ("PayloadTooLarge", {"code": "PayloadTooLarge"}),
            "aleph_alpha": "PAYLOAD_TOO_LARGE",
            "lmi": "PayloadTooLargeException",
            "ovms": None,
            "anthropic": "request_too_large",
        },
    ),
    SharedError(
        "415",
        cases.NOT_JSON_MEDIA,
        415,
        {
            "openai": (INVALID, None, "UnsupportedMediaType"),
            "azure": ("UnsupportedMediaType", {"code": "UnsupportedMediaType"}),
            "aleph_alpha": "UNSUPPORTED_MEDIA_TYPE",
            "lmi": "BadRequestException",
            "ovms": None,
            "anthropic": "invalid_request_error",
        },
    ),
    SharedError(
        "422 unsupported parameter (Azure: detail with loc, and the value as JSON text)",
        cases.UNSUPPORTED_PARAMETER,
        422,
        {
            "openai": (INVALID, "top_k", "UnsupportedParameter"),
            "azure": (
                "UnsupportedParameter",
                {"code": "UnsupportedParameter", "detail": {"loc": ["body", "top_k"], "value": "5"}},
            ),
            "aleph_alpha": "UNSUPPORTED_PARAMETER",
            "lmi": "BadRequestException",
            "ovms": None,
            "anthropic": "invalid_request_error",
        },
    ),
    SharedError(
        "429 with Retry-After (Azure: no code in the body)",
        cases.RATE_LIMITED,
        429,
        {
            "openai": ("rate_limit_error", None, "RateLimitExceeded"),
            "azure": ("RateLimitExceeded", {}),
            "aleph_alpha": "RATE_LIMIT_EXCEEDED",
            "lmi": "ServiceUnavailableException",
            "ovms": None,
            "anthropic": "rate_limit_error",
        },
        cases.RATE_LIMIT_HEADERS,
    ),
    SharedError(
        "500",
        cases.INTERNAL,
        500,
        {
            "openai": ("server_error", None, "InternalServerError"),
            "azure": ("InternalServerError", {"code": "InternalServerError"}),
            "aleph_alpha": "INTERNAL_SERVER_ERROR",
            "lmi": "InternalServerException",
            "ovms": None,
            "anthropic": "api_error",
        },
    ),
    SharedError(
        "502",
        cases.ANSWER_TOO_LARGE,
        502,
        {
            "openai": ("upstream_error", None, "ResponseTooLarge"),
            "azure": ("ResponseTooLarge", {"code": "ResponseTooLarge"}),
            "aleph_alpha": "RESPONSE_TOO_LARGE",
            "lmi": "BadGatewayException",
            "ovms": None,
            "anthropic": "api_error",
        },
    ),
    SharedError(
        "503 with Retry-After",
        cases.NO_REPLICA,
        503,
        {
            "openai": ("server_error", None, "NoHealthyReplica"),
            "azure": ("NoHealthyReplica", {"code": "NoHealthyReplica"}),
            "aleph_alpha": "NO_HEALTHY_REPLICA",
            "lmi": "ServiceUnavailableException",
            "ovms": None,
            "anthropic": "overloaded_error",
        },
        {"Retry-After": "5"},
        {"anthropic": 529},  # Anthropic's "overloaded"
    ),
    SharedError(
        "504",
        cases.UPSTREAM_TIMEOUT,
        504,
        {
            "openai": ("timeout_error", None, "UpstreamTimeout"),
            "azure": ("UpstreamTimeout", {"code": "UpstreamTimeout"}),
            "aleph_alpha": "UPSTREAM_TIMEOUT",
            "lmi": "TimeoutException",
            "ovms": None,
            "anthropic": "timeout_error",
        },
    ),
]


@pytest.mark.parametrize("shared", SHARED_ERRORS, ids=lambda shared: shared.id)
@pytest.mark.parametrize("dialect", DIALECTS)
def test_shared_error(dialect: str, shared: SharedError):
    tables, words = TABLES[dialect], column(shared.words, dialect)
    rendered = cases.translator(dialect).error(shared.error, "request-1")
    expected_headers = tables.error_headers(shared.error, words, dict(shared.headers))
    status = shared.statuses.get(dialect, shared.status)
    assert (rendered.status, rendered.body, rendered.headers) == (
        status,
        tables.error_body(shared.error, words),
        expected_headers,
    )
    assert document_errors(dialect, status, rendered.body) == []


@pytest.mark.parametrize(("dialect", "case"), rows(lambda t: t.errors))
def test_error(dialect: str, case: ErrorCase):
    rendered = cases.translator(dialect).error(case.error, "request-1")
    assert (rendered.status, rendered.body, rendered.headers) == (case.status, case.body, case.headers)
    assert document_errors(dialect, case.status, rendered.body) == []
