"""What every dialect's tables draw on: its translator built from its document the way the gateway
builds it, the canonical inputs (answers, completions, events, gateway errors) and a check of a
stream chunk against the dialect's own document."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import jsonschema_rs

from gateway.app import facts_of
from gateway.core.canonical import (
    ChatRequest,
    Choice,
    CompletionTokensDetails,
    Event,
    PromptTokensDetails,
    ServedBy,
    TokenLogprob,
    ToolCallDelta,
    TopLogprob,
    Usage,
    answer_too_large,
)
from gateway.core.errors import (
    BadRequest,
    ContentFiltered,
    DeploymentForbidden,
    GatewayError,
    GatewayTimeout,
    InternalError,
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    ServiceUnavailable,
    TooManyRequests,
    Unauthorized,
    UnprocessableContent,
    UnsupportedMediaType,
)
from gateway.dialects.registry import DIALECTS
from gateway.dialects.translator import Answer, Translator
from gateway.http.documents import load_document
from gateway.http.validation import to_json_schema
from tests.support.dialect_routes import main_routes
from tests.support.documents import closed


@cache
def translator(dialect_name: str) -> Translator[Any]:
    """The dialect's translator, made from its document's facts as gateway/app.py makes it."""
    dialect = DIALECTS[dialect_name]
    return dialect.translator(facts_of(load_document(dialect.document), dialect.chat_operations))


# ----- requests -------------------------------------------------------------------------------

# each dialect's chat path in its document (its first chat operation's)
CHAT_PATHS = {name: route.doc_path for name, route in main_routes().items()}

USER_MESSAGES = [{"role": "user", "content": "Hi"}]
MINIMAL_BODY = {"messages": USER_MESSAGES}


def request(**fields: Any) -> ChatRequest:
    """The canonical request of the minimal body, with `fields` changed."""
    return ChatRequest(**{"model": None, "messages": USER_MESSAGES, **fields})


@dataclass(frozen=True)
class ReadCase:
    """A body (the minimal one plus `body`) and the canonical request it reads as (the minimal
    one plus `expected`)."""

    id: str
    body: dict[str, Any]
    expected: dict[str, Any] = field(default_factory=dict)


def parameters_in(*tables: Sequence[Any]) -> set[str]:
    """Every body parameter a dialect's tables send (rows plain or wrapped in pytest.param)."""
    rows = [getattr(row, "values", (row,))[0] for table in tables for row in table]
    return {"messages", *(name for row in rows for name in row.body)}


@dataclass(frozen=True)
class RefusedCase:
    """A body the dialect's rules refuse, and the error that says so."""

    id: str
    body: dict[str, Any]
    error: type[GatewayError]
    code: str
    param: str | None
    loc: list[str | int] | None
    value: Any = None


def rejected(name: str, value: Any) -> RefusedCase:
    """A parameter the dialect's document marks unsupported and refuses (400), sent as `value`."""
    return RefusedCase(
        f"rejected: {name}", {name: value}, BadRequest, "UnsupportedParameter", name, ["body", name], value
    )


# ----- answers ---------------------------------------------------------------------------------

ANSWER_ID = "chatcmpl-0123456789abcdef"
CREATED = 1_700_000_000
MODEL = "echo"
USAGE = Usage(prompt_tokens=3, completion_tokens=2)
USAGE_BODY = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}


def answer(*, include_usage: bool = False, **fields: Any) -> Answer:
    """The answer every body of a test shares (its id, time and model), to a request with
    `fields` changed."""
    return Answer(ANSWER_ID, CREATED, MODEL, request(stream=True, include_usage=include_usage, **fields))


def stream(
    translator: Translator[Any], events: list[Event], *, include_usage: bool = False, **fields: Any
) -> list[dict]:
    """The chunks a stream of events becomes, in order, through one stream state."""
    state, shared = translator.new_stream_state(), answer(include_usage=include_usage, **fields)
    return [chunk for event in events for chunk in translator.chunks(shared, event, state)]


# "Hé" is two code points and three UTF-8 bytes: the `bytes` of dialects that differ tell apart.
LOGPROBS = [
    TokenLogprob("Hé", -0.25, [TopLogprob("Hé", -0.25), TopLogprob("Ho", -1.5)]),
    TokenLogprob("!", -0.5),
]
MISSING_LOGPROB = [TokenLogprob("?", None)]  # the backend could not say
# an upstream said null: a special token with no byte form; and bytes it gave, kept as given
NO_BYTES = [TokenLogprob("<|end|>", -0.1, [TopLogprob("<|end|>", -0.1, None)], bytes=None)]
GIVEN_BYTES = [TokenLogprob("é", -0.2, bytes=[195, 169])]
# LOGPROBS and MISSING_LOGPROB as OpenAI-shaped `logprobs.content` entries (bytes as UTF-8, a
# missing logprob as -9999.0); a dialect that writes them otherwise (LMI's code points) has its own
BANG_CONTENT = {"token": "!", "logprob": -0.5, "bytes": [33], "top_logprobs": []}
LOGPROBS_CONTENT = [
    {
        "token": "Hé",
        "logprob": -0.25,
        "bytes": [72, 195, 169],
        "top_logprobs": [
            {"token": "Hé", "logprob": -0.25, "bytes": [72, 195, 169]},
            {"token": "Ho", "logprob": -1.5, "bytes": [72, 111]},
        ],
    },
    BANG_CONTENT,
]
MISSING_LOGPROB_CONTENT = [{"token": "?", "logprob": -9999.0, "bytes": [63], "top_logprobs": []}]
REFUSAL = "I can't help with that."
SERVED = ServedBy(system_fingerprint="fp_44709d6fcb", service_tier="default")
DETAILED_USAGE = Usage(
    prompt_tokens=3,
    completion_tokens=2,
    completion_tokens_details=CompletionTokensDetails(reasoning_tokens=7, audio_tokens=0),
    prompt_tokens_details=PromptTokensDetails(cached_tokens=4),
)
WEATHER_CALL = ToolCallDelta(
    index=0, call_index=0, id="call_1", name="get_weather", arguments='{"city":"Paris"}'
)
WEATHER_CALL_BODY = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
}


def completion_body(choices: list[dict[str, Any]], *, without: tuple[str, ...] = ()) -> dict[str, Any]:
    """The completion body of the shared answer with these `choices` (less the fields a dialect's
    document has no place for)."""
    body = {
        "id": ANSWER_ID,
        "object": "chat.completion",
        "created": CREATED,
        "model": MODEL,
        "choices": choices,
        "usage": USAGE_BODY,
    }
    return {key: value for key, value in body.items() if key not in without}


@dataclass(frozen=True)
class CompletionCase:
    """Gathered choices and the `choices` of the completion body they render as."""

    id: str
    choices: list[Choice]
    expected: list[dict[str, Any]]
    # False where the translator knowingly answers what the document does not allow (see the row)
    checked_against_document: bool = True
    request: dict[str, Any] = field(default_factory=dict)  # the request's fields that differ


@dataclass(frozen=True)
class StreamCase:
    """A stream's events and the chunks they become."""

    id: str
    events: list[Event]
    expected: list[dict[str, Any]]
    include_usage: bool = False
    request: dict[str, Any] = field(default_factory=dict)  # the request's fields that differ


@dataclass(frozen=True)
class AnswerCase:
    """What a backend said of the whole answer (ServedBy, usage) and the completion's top-level
    fields besides id, object, created, model and choices."""

    id: str
    served: ServedBy
    usage: Usage
    expected: dict[str, Any]


# ----- gateway errors, each as the code that raises it does ----------------------------------

INVALID_BODY = BadRequest(
    "Invalid request body: 5 is not of type 'string' at 'messages[0].content'",
    param="messages[0].content",
    loc=["body", "messages", 0, "content"],
    value=5,
)  # gateway/http/validation.py
NOT_JSON = BadRequest("The request body is not valid JSON: unexpected end of data")  # no param
EXTRA_PARAMETER = BadRequest(
    "Extra parameters ['mood'] are not allowed when 'extra-parameters' is 'error' "
    "(send 'extra-parameters: pass-through' or 'drop' to change this).",
    param="mood",
    loc=["body", "mood"],
    value="calm",
    code="ExtraParameterNotAllowed",
)  # gateway/policy/extra_params.py
PROMPT_FILTERED = ContentFiltered(
    "The prompt was refused by the content filter; change it and try again.",
    param="messages",
    loc=["body", "messages"],
    code="content_filter",
)  # gateway/policy/content_filter.py
NO_KEY = Unauthorized("No authorization token provided")  # gateway/policy/auth.py
HIDDEN_DEPLOYMENT = DeploymentForbidden("text-only")  # gateway/runtime.py
UNKNOWN_MODEL = NotFound(
    "The model 'gpt-x' does not exist or you do not have access to it.",
    param="model",
    code="ModelNotFound",
)  # gateway/fleet/router.py
WRONG_METHOD = MethodNotAllowed(
    "Method GET not allowed for /chat/completions", headers={"Allow": "POST"}
)  # gateway/http/front_door.py
BODY_TOO_LARGE = PayloadTooLarge("Request body exceeds the gateway's limit of 4096 bytes.")
NOT_JSON_MEDIA = UnsupportedMediaType("Invalid Content-type (text/plain), expected ['application/json']")
UNSUPPORTED_PARAMETER = UnprocessableContent(
    "The model does not take this parameter (parameter 'top_k').",
    param="top_k",
    loc=["body", "top_k"],
    value=5,
    code="UnsupportedParameter",
)  # gateway/policy/capabilities.py
RATE_LIMITED = TooManyRequests(
    "Rate limit reached for requests; retry after 7 seconds.",
    code="RateLimitExceeded",
    headers={
        "Retry-After": "7",
        "x-ratelimit-limit-requests": "1",
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": "7s",
    },
)  # gateway/policy/limits.py
RATE_LIMIT_HEADERS = dict(RATE_LIMITED.headers)
INTERNAL = InternalError("The gateway failed to handle this request.")  # gateway/http/front_door.py
ANSWER_TOO_LARGE = answer_too_large(1_000_000)  # gateway/core/canonical.py
NO_REPLICA = ServiceUnavailable(
    "No healthy replica of 'echo' can take the request now.",
    code="NoHealthyReplica",
    headers={"Retry-After": "5"},
)  # gateway/fleet/dispatch.py
UPSTREAM_TIMEOUT = GatewayTimeout(
    "The model did not answer in time (first byte: 30s).", code="UpstreamTimeout"
)  # gateway/fleet/dispatch.py


@dataclass(frozen=True)
class ErrorCase:
    """A gateway error and how the dialect answers it."""

    id: str
    error: GatewayError
    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


# ----- the documents' stream chunks ------------------------------------------------------------


@cache
def chunk_validator(spec_file: str, path: str) -> jsonschema_rs.Draft4Validator:
    """The chunk schema of the operation's stream: the schema of its JSON-lines media type, or
    the `x-contentSchema` of an SSE event's `data` (which a JSON Schema validator cannot follow)."""
    document = load_document(spec_file)
    content = document["paths"][path]["post"]["responses"]["200"]["content"]
    (stream_media_type,) = (media_type for media_type in content if media_type != "application/json")
    reference = content[stream_media_type]["schema"]["$ref"]
    schema = document["components"]["schemas"][reference.rsplit("/", 1)[1]]
    event_data = schema.get("properties", {}).get("data")
    if event_data is not None:  # an SSE event: [DONE], a chunk, or an error
        (reference,) = (
            branch["x-contentSchema"]["$ref"]
            for branch in event_data["anyOf"]
            if "x-contentSchema" in branch and "Error" not in branch["x-contentSchema"]["$ref"]
        )
    return jsonschema_rs.Draft4Validator(
        {"$ref": reference, "components": closed(to_json_schema(document["components"]))}
    )


def chunk_errors(spec_file: str, path: str, chunk: dict[str, Any]) -> list[str]:
    """Messages for every way `chunk` breaks the document's stream chunk, fields it does not
    define included; [] when it conforms."""
    validator = chunk_validator(spec_file, path)
    return [f"{list(e.instance_path)}: {e.message}" for e in validator.iter_errors(chunk)]


# ----- a dialect's tables ----------------------------------------------------------------------


@dataclass(frozen=True)
class DialectTables:
    """What a dialect's module hands the shared tests (test_answers.py): its rows, and where its
    document defines the chat operation they are held to."""

    dialect: str
    spec: str  # its file in openapi/
    paths: tuple[str, ...]  # its chat operations' paths (the same request and answers)
    reads: Sequence[Any]  # ReadCase rows, plain or wrapped in pytest.param
    completions: Sequence[CompletionCase]
    streams: Sequence[StreamCase]
    errors: Sequence[ErrorCase]
    refused: Sequence[RefusedCase] = ()
    answers: Sequence[AnswerCase] = ()  # where the document has fields for what the backend said
    completion_without: tuple[str, ...] = ()  # fields of completion_body its document lacks
    # a shared gateway error's body (and headers) from the dialect's words for it (test_answers.py)
    error_body: Callable[[GatewayError, Any], dict[str, Any]] = lambda error, words: {}
    error_headers: Callable[[GatewayError, Any, dict[str, str]], dict[str, str]] = (
        lambda error, words, headers: headers
    )
