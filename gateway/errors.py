"""Typed gateway errors. Each carries its HTTP status; each dialect renders them in its own shape."""

from __future__ import annotations

from typing import Any


class GatewayError(Exception):
    """Base of every error the gateway answers on purpose.

    `code` is a stable machine name (Azure's `x-ms-error-code`, OpenAI's `code`);
    `param`/`loc`/`value` point at the offending part of the request when there is one.
    """

    status: int = 500
    code: str = "InternalServerError"
    kind: str = "server_error"

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


def _error(name: str, status: int, code: str, kind: str) -> type[GatewayError]:
    cls = type(name, (GatewayError,), {"status": status, "code": code, "kind": kind})
    cls.__doc__ = f"HTTP {status}: {code}."
    return cls


BadRequest = _error("BadRequest", 400, "BadRequest", "invalid_request_error")
Unauthorized = _error("Unauthorized", 401, "Unauthorized", "authentication_error")
Forbidden = _error("Forbidden", 403, "Forbidden", "permission_error")
NotFound = _error("NotFound", 404, "NotFound", "not_found_error")
MethodNotAllowed = _error("MethodNotAllowed", 405, "MethodNotAllowed", "invalid_request_error")
PayloadTooLarge = _error("PayloadTooLarge", 413, "PayloadTooLarge", "invalid_request_error")
UnsupportedMediaType = _error("UnsupportedMediaType", 415, "UnsupportedMediaType", "invalid_request_error")
UnprocessableContent = _error("UnprocessableContent", 422, "UnprocessableContent", "invalid_request_error")
TooManyRequests = _error("TooManyRequests", 429, "TooManyRequests", "rate_limit_error")
ContentFiltered = _error("ContentFiltered", 400, "ContentFilter", "invalid_request_error")
InternalError = _error("InternalError", 500, "InternalServerError", "server_error")
BadGateway = _error("BadGateway", 502, "BadGateway", "upstream_error")
ServiceUnavailable = _error("ServiceUnavailable", 503, "ServiceUnavailable", "server_error")
GatewayTimeout = _error("GatewayTimeout", 504, "GatewayTimeout", "timeout_error")

BY_STATUS: dict[int, type[GatewayError]] = {
    cls.status: cls
    for cls in (
        BadRequest,
        Unauthorized,
        Forbidden,
        NotFound,
        MethodNotAllowed,
        PayloadTooLarge,
        UnsupportedMediaType,
        UnprocessableContent,
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
