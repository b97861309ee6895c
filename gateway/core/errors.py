"""Typed gateway errors, one class per kind, each carrying its HTTP status. Every dialect renders
them in its own shape (its translator's `error`), in one place."""

from __future__ import annotations

from typing import Any


class GatewayError(Exception):
    """Base of every error the gateway answers on purpose.

    `code` is a stable machine name (Azure's `x-ms-error-code`, OpenAI's `code`);
    `param`/`loc`/`value` point at the offending part of the request when there is one.
    """

    status: int = 500
    code: str = "InternalServerError"
    kind: str = "server_error"  # OpenAI's `type`

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        loc: list[str | int] | None = None,
        value: Any = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.loc = loc
        self.value = value
        self.headers = dict(headers or {})
        if code is not None:
            self.code = code

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.status}, {self.code}: {self.message})"


class BadRequest(GatewayError):
    """400: the request cannot be read, or breaks its dialect's document or rules."""

    status, code, kind = 400, "BadRequest", "invalid_request_error"


class ContentFiltered(BadRequest):
    """400: the content filter refused the prompt (Azure's ContentFilterError)."""

    code = "ContentFilter"


class Unauthorized(GatewayError):
    """401: no key, or not a key the gateway knows."""

    status, code, kind = 401, "Unauthorized", "authentication_error"


class Forbidden(GatewayError):
    """403: the key is known but may not do this."""

    status, code, kind = 403, "Forbidden", "permission_error"


class DeploymentForbidden(Forbidden):
    """403 by default: the key may not use this deployment. Dialects whose documents say a
    hidden deployment is simply not found (OpenAI, Azure) render it as their 404."""

    code = "DeploymentNotAllowed"

    def __init__(self, deployment: str, asked: str | None = None) -> None:
        super().__init__(f"This key may not use the deployment '{deployment}'.", param="model")
        self.deployment = deployment
        # what the client named (a model, an alias, a deployment): all that a 404 may name
        self.asked = asked or deployment


class NotFound(GatewayError):
    """404: no such model, deployment, path, or a modality the model lacks."""

    status, code, kind = 404, "NotFound", "not_found_error"


class ModelNotFound(NotFound):
    """404: no deployment serves this model name."""

    code = "ModelNotFound"

    def __init__(self, model: str) -> None:
        super().__init__(
            f"The model '{model}' does not exist or you do not have access to it.", param="model"
        )
        self.model = model


class DeploymentNotFound(NotFound):
    """404: no deployment has this name (Azure's `azureml-model-deployment` header)."""

    code = "DeploymentNotFound"

    def __init__(self, deployment: str, header: str = "azureml-model-deployment") -> None:
        super().__init__(f"Deployment '{deployment}' not found.", param=header)
        self.deployment = deployment


class MethodNotAllowed(GatewayError):
    """405: the path exists, the method does not (the `Allow` header lists those that do)."""

    status, code, kind = 405, "MethodNotAllowed", "invalid_request_error"


class ClientGone(GatewayError):
    """499 (nginx's "client closed request"): the client left before the answer; nobody reads it."""

    status, code, kind = 499, "ClientClosedRequest", "invalid_request_error"


class RequestTimeout(GatewayError):
    """408: the client took too long to send its request."""

    status, code, kind = 408, "RequestTimeout", "invalid_request_error"


class PayloadTooLarge(GatewayError):
    """413: the body is larger than the gateway reads."""

    status, code, kind = 413, "PayloadTooLarge", "invalid_request_error"


class UnsupportedMediaType(GatewayError):
    """415: the body is not JSON (or is encoded in a way the gateway does not read)."""

    status, code, kind = 415, "UnsupportedMediaType", "invalid_request_error"


class UnprocessableContent(GatewayError):
    """422: a known parameter or value the chosen model cannot honour."""

    status, code, kind = 422, "UnprocessableContent", "invalid_request_error"


class RequestHeadersTooLarge(GatewayError):
    """431: the request's header block is larger than the gateway reads."""

    status, code, kind = 431, "RequestHeaderFieldsTooLarge", "invalid_request_error"


class TooManyRequests(GatewayError):
    """429: a rate limit or a budget is used up, or the upstream is busy."""

    status, code, kind = 429, "TooManyRequests", "rate_limit_error"


class InternalError(GatewayError):
    """500: the gateway failed; never on purpose."""

    status, code, kind = 500, "InternalServerError", "server_error"


class BadGateway(GatewayError):
    """502: the upstream answered in a way the gateway cannot relay."""

    status, code, kind = 502, "BadGateway", "upstream_error"


class UpstreamRefused(BadGateway):
    """502: the upstream refused the gateway's own request (its credentials, 401/403). Another
    try, on this replica or another with the same settings, gets the same answer: never retried,
    and no mark against the replica's health."""

    code = "UpstreamRefused"


class UpstreamAnswerTooLarge(BadGateway):
    """502: the upstream's answer (its headers or its body) is larger than the gateway reads. The
    same request elsewhere would be as large: never retried, and no mark against the replica."""

    code = "ResponseTooLarge"


class ServiceUnavailable(GatewayError):
    """503: no replica can take the request now, or a store the gateway needs is away."""

    status, code, kind = 503, "ServiceUnavailable", "server_error"


class UpstreamUnreachable(ServiceUnavailable):
    """503: the upstream cannot be reached (refused, unresolvable, TLS failed): the replica is
    ejected at once."""


class UpstreamBusy(ServiceUnavailable):
    """503: every connection to the upstream is taken: busy, not broken (no mark against it)."""


class GatewayTimeout(GatewayError):
    """504: the upstream did not answer in time."""

    status, code, kind = 504, "GatewayTimeout", "timeout_error"


BY_STATUS: dict[int, type[GatewayError]] = {
    cls.status: cls
    for cls in (
        BadRequest,
        Unauthorized,
        Forbidden,
        NotFound,
        MethodNotAllowed,
        RequestTimeout,
        PayloadTooLarge,
        UnsupportedMediaType,
        UnprocessableContent,
        RequestHeadersTooLarge,
        TooManyRequests,
        InternalError,
        BadGateway,
        ServiceUnavailable,
        GatewayTimeout,
    )
}


def error_for_status(status: int, message: str, **kwargs: Any) -> GatewayError:
    """The gateway error for an HTTP status (unknown 4xx → BadRequest, unknown 5xx → InternalError)."""
    cls = BY_STATUS.get(status) or (BadRequest if 400 <= status < 500 else InternalError)
    error = cls(message, **kwargs)
    if cls.status != status and 400 <= status < 500:
        error.status = status
    return error
