"""TGI's failures → gateway errors: its error answers by status and error_type, huggingface_hub's
exceptions by what they say about them, connections by what broke."""

from __future__ import annotations

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

from gateway.core.errors import (
    BadGateway,
    GatewayError,
    GatewayTimeout,
    PayloadTooLarge,
    ServiceUnavailable,
    TooManyRequests,
    UnprocessableContent,
)

# TGI's parameter names in its validation messages → the canonical names clients sent.
CANONICAL_NAMES = {
    "max_new_tokens": "max_tokens",
    "top_n_tokens": "top_logprobs",
    "grammar": "response_format",
    "inputs": "messages",
    "best_of": "n",
}
BACKTICKED = re.compile(r"`(\w+)`")
RETRY_AFTER_SECONDS = "1"


def unprocessable(message: str) -> UnprocessableContent:
    """TGI's 422, with the parameter named when TGI's message names one (`like_this`)."""
    named = BACKTICKED.search(message)
    param = CANONICAL_NAMES.get(named.group(1), named.group(1)) if named else None
    if param is None and message.lower().startswith(("template error", "tool error")):
        param = "messages" if message.lower().startswith("template") else "tools"
    return UnprocessableContent(
        f"TGI refused the request: {message}",
        param=param,
        loc=["body", param] if param else None,
        code="UpstreamValidationError",
    )


def overloaded(message: str, retry_after: str | None) -> TooManyRequests:
    return TooManyRequests(
        f"TGI is overloaded: {message}", headers={"Retry-After": retry_after or RETRY_AFTER_SECONDS}
    )


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
    status = response.status_code
    message, error_type = error_body(response)
    if status == 422 or error_type == "validation":
        return unprocessable(message)
    if status == 429 or error_type == "overloaded":
        return overloaded(message, response.headers.get("retry-after"))
    if status == 413:
        return PayloadTooLarge(f"TGI refused the request as too large: {message}")
    if status == 503:
        return ServiceUnavailable(f"TGI is unavailable: {message}")
    if status in (408, 504):
        return GatewayTimeout(f"TGI timed out: {message}")
    if status == 424 or error_type == "generation":
        return BadGateway(f"TGI failed during generation: {message}")
    return BadGateway(f"TGI answered HTTP {status}: {message}")


def upstream_error(error: Exception) -> GatewayError:
    """Any failure talking to TGI → the gateway error the client gets."""
    cause = error.__cause__
    response = getattr(cause, "response", None) if isinstance(cause, HfHubHTTPError) else None
    match error:
        case TGIValidationError():
            return unprocessable(str(error))
        case OverloadedError():
            retry_after = response.headers.get("retry-after") if response is not None else None
            return overloaded(str(error), retry_after)
        case GenerationError() | IncompleteGenerationError():
            return BadGateway(f"TGI failed during generation: {error}")
        case TextGenerationError():
            if response is not None:
                return error_for_response(response)
            return BadGateway(f"TGI reported an error: {error}")
        case InferenceTimeoutError() | httpx2.TimeoutException():
            return GatewayTimeout("TGI did not answer in time.")
        case HfHubHTTPError():
            return error_for_response(error.response)
        case httpx2.ConnectError():
            return ServiceUnavailable("TGI is not reachable (connection refused or no route).")
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
