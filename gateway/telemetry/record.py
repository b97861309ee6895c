"""What one request did, filled in as it travels; the access log and the metrics read it
(not tracing: that is OpenTelemetry's word)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from gateway.core.trace import Trace


@dataclass(slots=True)
class RequestRecord:
    request_id: str
    method: str
    path: str
    started: float = field(default_factory=time.perf_counter)
    dialect: str = ""  # "" off every mount
    route: str = ""  # the operation's path as its document mounts it, or "unmatched": never the path
    deployment: str = ""
    replica: str = ""
    key: str = ""
    status: int = 0
    stream: bool = False
    first_token_at: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float | None = None  # from the deployment's price, when it has one
    retries: int = 0
    error_code: str = ""
    ids: Trace | None = None  # the ids sent upstream with the request, and the upstream's own
    rate_limited: str = ""  # "requests" / "tokens" when a limit refused the request
    model: str = ""  # as the request named it (or the deployment's)
    backend: str = ""  # the kind of backend that answered
    span: Any = None  # its OpenTelemetry server span, when tracing is on

    def first_token(self) -> None:
        if self.first_token_at is None:
            self.first_token_at = time.perf_counter()

    @property
    def upstream_request_id(self) -> str | None:
        """The x-request-id the upstream (its last try) answered with."""
        return None if self.ids is None else self.ids.upstream_request_id

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.started
