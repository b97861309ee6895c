"""TGI's failures → gateway errors: its error answers by STATUSES (backends.http.status),
huggingface_hub's exceptions by what they say about them, connections by what broke."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from contextlib import contextmanager

import httpx2
from huggingface_hub.errors import (
    GenerationError,
    HfHubHTTPError,
    IncompleteGenerationError,
    InferenceTimeoutError,
    OverloadedError,
    TextGenerationError,
)
from huggingface_hub.errors import ValidationError as TGIValidationError

from backends.http.status import CREDENTIALS, Answer, StatusTable, UpstreamFailure, redacted, status_error
from gateway.core.errors import (
    BadGateway,
    GatewayError,
    GatewayTimeout,
    PayloadTooLarge,
    ServiceUnavailable,
    TooManyRequests,
    UnprocessableContent,
    UpstreamUnreachable,
)

TIMED_OUT = Answer(GatewayTimeout, "TGI timed out: {message}")
ANSWERED = Answer(BadGateway, "TGI answered HTTP {status}: {message}")
# a 5xx is said in the gateway's words: a failing server's own (tracebacks, paths) stay in the log
FAILED = Answer(BadGateway, "TGI failed on this request (HTTP {status}).")
STATUSES = StatusTable(
    "TGI",
    {
        401: CREDENTIALS,
        403: CREDENTIALS,
        408: TIMED_OUT,
        413: Answer(PayloadTooLarge, "TGI refused the request as too large: {message}"),
        422: Answer(
            UnprocessableContent,
            "TGI refused the request: {message}",
            names_param=True,
            points_at_param=True,
            code="UpstreamValidationError",
        ),
        424: Answer(BadGateway, "TGI failed during generation: {message}"),
        429: Answer(
            TooManyRequests, "TGI is overloaded: {message}", keeps_retry_after=True, retry_after_default="1"
        ),
        503: Answer(ServiceUnavailable, "TGI is unavailable (HTTP 503)."),
        504: Answer(GatewayTimeout, "TGI timed out (HTTP 504)."),
        "4xx": ANSWERED,
        "5xx": FAILED,
    },
)
# TGI's error_type, when it sends one, says which of its statuses the error is.
ERROR_TYPE_STATUS = {"validation": 422, "overloaded": 429, "generation": 424}
# TGI's parameter names in its validation messages → the canonical names clients sent.
CANONICAL_NAMES = {
    "max_new_tokens": "max_tokens",
    "top_n_tokens": "top_logprobs",
    "grammar": "response_format",
    "inputs": "messages",
    "best_of": "n",
}
BACKTICKED = re.compile(r"`(\w+)`")


def named_parameter(message: str) -> str | None:
    """The parameter a TGI validation message names (`like_this`), by its canonical name."""
    named = BACKTICKED.search(message)
    if named:
        return CANONICAL_NAMES.get(named.group(1), named.group(1))
    if message.lower().startswith("template error"):
        return "messages"
    if message.lower().startswith("tool error"):
        return "tools"
    return None


def tgi_error(status: int, message: str, retry_after: str | None = None) -> GatewayError:
    """The gateway error for one of TGI's error answers."""
    param = named_parameter(message) if status == 422 else None
    return status_error(STATUSES, UpstreamFailure(status, message, param, retry_after))


def error_body(response: httpx2.Response) -> tuple[str, str | None]:
    """TGI's `{error, error_type}` from an error response (read by `read_error_body`)."""
    try:
        body = response.json()
    except Exception:  # not read, not JSON: keep the status line
        return f"HTTP {response.status_code}", None
    if not isinstance(body, dict):
        return str(body)[:500], None
    return str(body.get("error") or body)[:2000], body.get("error_type")


def error_for_response(response: httpx2.Response) -> GatewayError:
    message, error_type = error_body(response)
    # TGI or its proxy may quote the token it was sent: never relayed (a response made without
    # its request, as tests make them, has no headers to redact)
    with contextlib.suppress(RuntimeError):
        message = redacted(message, response.request.headers.values())
    status = ERROR_TYPE_STATUS.get(error_type or "", response.status_code)
    return tgi_error(status, message, response.headers.get("retry-after"))


def upstream_error(error: Exception) -> GatewayError:
    """Any failure talking to TGI → the gateway error the client gets."""
    cause = error.__cause__
    response = getattr(cause, "response", None) if isinstance(cause, HfHubHTTPError) else None
    match error:
        case TGIValidationError():
            return tgi_error(422, str(error))
        case OverloadedError():
            return tgi_error(
                429, str(error), response.headers.get("retry-after") if response is not None else None
            )
        case GenerationError() | IncompleteGenerationError():
            return tgi_error(424, str(error))
        case TextGenerationError():
            if response is not None:
                return error_for_response(response)
            return BadGateway(f"TGI reported an error: {error}")
        case InferenceTimeoutError() | httpx2.TimeoutException():
            return GatewayTimeout("TGI did not answer in time.")
        case HfHubHTTPError():
            return error_for_response(error.response)
        case httpx2.ConnectError():
            return UpstreamUnreachable("TGI is not reachable (connection refused or no route).")
        case httpx2.TransportError():
            return BadGateway(f"The connection to TGI broke: {type(error).__name__}.")
        case _:
            return BadGateway(f"TGI sent something unexpected: {type(error).__name__}: {error}")


@contextmanager
def translated_errors() -> Iterator[None]:
    try:
        yield
    except GatewayError:
        raise
    except Exception as error:  # CancelledError and GeneratorExit are BaseException: untouched
        raise upstream_error(error) from error


async def read_error_body(response: httpx2.Response) -> None:
    """Read a (small) error body so TGI's `{error, error_type}` can be reported after the stream."""
    if response.status_code >= 400 and int(response.headers.get("content-length") or 0) < 1 << 20:
        await response.aread()
