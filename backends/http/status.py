"""An upstream's HTTP error answer → the gateway error the client gets, by a table per backend.

Each backend reads its upstream's error body its own way (into an `UpstreamFailure`) and says, as
data, which gateway error each status becomes (a `StatusTable`); `status_error` applies it. Every
table answers 401/403 with `CREDENTIALS`: the upstream refused the gateway's own credentials, so
the client gets a 502 that repeats nothing of the upstream's answer (which may quote the key), and
the request is not tried again.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime

from gateway.core.errors import GatewayError, UpstreamRefused

CLIENT_MESSAGE_LIMIT = 300
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]+")
TRACEBACK = re.compile(r"Traceback \(most recent call last\)|\bFile \"[^\"]+\", line \d+|\n\s+at \S+\(")
DELAY_SECONDS = re.compile(r"[0-9]{1,12}")
MIN_SECRET_CHARS = 4  # shorter header values (`1`, `on`) are no secret worth a redaction
RETRY_AFTER_MOST = 86_400  # a day: an upstream asking for longer is read as asking for a day
PATH = re.compile(r"(?<![\w:/.-])(?:[A-Za-z]:\\|~?/)(?:[\w.@+-]+[/\\])+[\w.@+-]*")


def client_safe(message: str, limit: int = CLIENT_MESSAGE_LIMIT) -> str:
    """An upstream's words as a client may read them: no traceback (cut where it begins), no
    file paths, no control characters, at most `limit` characters."""
    if found := TRACEBACK.search(message):
        message = (
            message[: found.start()].rstrip(" :\n") or "(the upstream's details are in the gateway's log)"
        )
    message = PATH.sub("<path>", message)
    message = CONTROL.sub(" ", message).strip()
    return message if len(message) <= limit else message[: limit - 1].rstrip() + "…"


def redacted(text: str, secrets: Iterable[str]) -> str:
    """`text` with every secret the gateway sends upstream (its key, its headers' values, and the
    credential alone where a header holds `Bearer <key>`) replaced: an upstream may echo them."""
    for secret in secrets:
        for part in {secret, secret.partition(" ")[2]}:
            if len(part) >= MIN_SECRET_CHARS:
                text = text.replace(part, "<redacted>")
    return text


def retry_after_seconds(value: str | None, now: float | None = None) -> str | None:
    """An upstream's Retry-After as the client gets it: delay-seconds, or an HTTP-date turned into
    the seconds until it, at most a day; None for anything else (`abc`, `-5`, markup), which is
    never relayed."""
    if value is None:
        return None
    value = value.strip()
    if DELAY_SECONDS.fullmatch(value):
        return str(min(int(value), RETRY_AFTER_MOST))
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None  # an HTTP-date is GMT; a date without a zone is not one
    seconds = when.timestamp() - (time.time() if now is None else now)
    return str(min(max(0, int(seconds + 0.999)), RETRY_AFTER_MOST))


@dataclass(frozen=True, slots=True)
class UpstreamFailure:
    """An upstream's error answer, read: its status and what the client may learn from it."""

    status: int
    message: str
    param: str | None = None  # the request parameter it names, by its canonical name
    retry_after: str | None = None  # the upstream's Retry-After header
    request_id: str | None = None  # the upstream's own id for the request (its x-request-id)


@dataclass(frozen=True, slots=True)
class Answer:
    """The gateway error one upstream status becomes."""

    error: type[GatewayError]
    message: str = "{message}"  # may name {upstream}, {status} and the upstream's {message}
    names_param: bool = False  # the error names the upstream's parameter (`param`) …
    points_at_param: bool = False  # … and points at it in the body (`loc`)
    code: str | None = None  # in place of the error class's own code
    keeps_retry_after: bool = False  # the upstream's Retry-After reaches the client …
    retry_after_default: str | None = None  # … or this one when it sent none


# never retried (gateway.fleet.dispatch): another try presents the same credentials
CREDENTIALS = Answer(UpstreamRefused, "{upstream} refused the gateway's credentials ({status}).")


@dataclass(frozen=True, slots=True)
class StatusTable:
    """One backend's answers: by status, with "4xx" and "5xx" for the statuses it does not name."""

    upstream: str  # how messages name the upstream ("TGI", "The upstream model server")
    answers: Mapping[int | str, Answer]

    def __post_init__(self) -> None:
        missing = {401, 403, "4xx", "5xx"} - set(self.answers)
        if missing:
            raise ValueError(f"a status table answers 401, 403, 4xx and 5xx; this one lacks {missing}")
        for status, answer in self.answers.items():
            if (
                status == "5xx" or (isinstance(status, int) and status >= 500)
            ) and "{message}" in answer.message:
                raise ValueError(
                    f"the answer to {status} repeats the upstream's words: say a 5xx in the gateway's"
                )


def status_error(table: StatusTable, failure: UpstreamFailure) -> GatewayError:
    """The gateway error for an upstream's error answer, as the backend's table says. A 4xx's
    message is relayed, made safe (`client_safe`); a 5xx is said in the gateway's words, with the
    upstream's request id: what a failing server says (tracebacks, file paths) is for its
    operators, and the backend logs it."""
    status = failure.status
    answer = table.answers.get(status) or table.answers["5xx" if status >= 500 else "4xx"]
    message = answer.message.format(
        upstream=table.upstream, status=status, message=client_safe(failure.message)
    )
    if failure.request_id and status >= 500:
        message = f"{message.rstrip('.')}; its request id: {client_safe(failure.request_id, 100)}."
    param = failure.param if answer.names_param else None
    retry_after = None
    if answer.keeps_retry_after:
        retry_after = retry_after_seconds(failure.retry_after) or answer.retry_after_default
    return answer.error(
        message,
        param=param,
        loc=["body", param] if param and answer.points_at_param else None,
        code=answer.code,
        headers={"Retry-After": retry_after} if retry_after else None,
    )
