"""Who a request is across hops: the ids the gateway sends upstream with it (its request id and
the client's W3C trace context), and the id the upstream answers with, for the access log."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

# W3C Trace Context, level 1: version-trace_id-parent_id-flags, lower-case hex
TRACEPARENT = re.compile(r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")
TRACESTATE_LIMIT = 512  # the spec's own bound on what a vendor must propagate
SAFE_TRACESTATE = re.compile(r"^[\x20-\x7e]*$")
UPSTREAM_ID_LIMIT = 200


@dataclass(slots=True)
class Trace:
    request_id: str = ""
    traceparent: str | None = None
    tracestate: str | None = None
    upstream_request_id: str | None = None  # set by the backend when the upstream answers

    @classmethod
    def of(cls, request_id: str, headers: Mapping[str, str]) -> Trace:
        """The client's trace context, kept only when well-formed (it is sent on as a header)."""
        traceparent = headers.get("traceparent")
        if traceparent is None or not TRACEPARENT.match(traceparent):
            return cls(request_id)
        tracestate = headers.get("tracestate")
        if tracestate is not None and (
            len(tracestate) > TRACESTATE_LIMIT or not SAFE_TRACESTATE.match(tracestate)
        ):
            tracestate = None
        return cls(request_id, traceparent, tracestate)

    def headers(self) -> dict[str, str]:
        """What goes upstream with the request."""
        sent = {"x-request-id": self.request_id} if self.request_id else {}
        if self.traceparent is not None:
            sent["traceparent"] = self.traceparent
            if self.tracestate:
                sent["tracestate"] = self.tracestate
        return sent

    def answered(self, upstream_request_id: str | None) -> None:
        """The upstream's own request id (None: it sent none), as the access log may show it;
        each try of the request says it again."""
        self.upstream_request_id = upstream_request_id[:UPSTREAM_ID_LIMIT] if upstream_request_id else None
