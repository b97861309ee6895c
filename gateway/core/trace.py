"""Who a request is across hops: the ids the gateway sends upstream with it (its request id and
the client's W3C trace context), and the id the upstream answers with, for the access log."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from gateway.core.ids import new_request_id

# W3C Trace Context, level 1: version-trace_id-parent_id-flags, lower-case hex
TRACEPARENT = re.compile(r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")
TRACESTATE_LIMIT = 512  # the spec's own bound on what a vendor must propagate
SAFE_TRACESTATE = re.compile(r"^[\x20-\x7e]*$")
UPSTREAM_ID_LIMIT = 200
# A client's session, as agent CLIs name it in a header (Claude Code; Codex CLI; the generic
# one): prefix affinity keeps a session's requests on one replica (gateway/fleet/affinity.py).
SESSION_HEADERS = ("x-claude-code-session-id", "session-id", "x-session-id")
SESSION_LIMIT = 256


@dataclass(slots=True)
class Trace:
    request_id: str = ""  # the client's (or, when it sent none, the gateway's)
    traceparent: str | None = None
    tracestate: str | None = None
    upstream_request_id: str | None = None  # set by the backend when the upstream answers
    sent_request_id: str = ""  # the gateway's own, the one the upstream gets: always a UUID
    session: str | None = None  # the client's session header, for affinity only: never sent on

    @classmethod
    def from_request(cls, request_id: str, headers: Mapping[str, str]) -> Trace:
        """The request's ids: the client's request id stays with the gateway (the access log, the
        answer's header), the upstream gets the gateway's own — a client's id may be anything an
        upstream refuses. The client's trace context is kept only when well-formed (it is sent
        on as a header)."""
        client_gave_it = headers.get("x-request-id") == request_id
        sent = new_request_id() if client_gave_it else request_id
        session = None
        for name in SESSION_HEADERS:
            if session := headers.get(name):
                session = session[:SESSION_LIMIT]
                break
        traceparent = headers.get("traceparent")
        if traceparent is None or not TRACEPARENT.match(traceparent):
            return cls(request_id, sent_request_id=sent, session=session)
        tracestate = headers.get("tracestate")
        if tracestate is not None and (
            len(tracestate) > TRACESTATE_LIMIT or not SAFE_TRACESTATE.match(tracestate)
        ):
            tracestate = None
        return cls(request_id, traceparent, tracestate, sent_request_id=sent, session=session)

    def headers(self) -> dict[str, str]:
        """What goes upstream with the request."""
        sent = {"x-request-id": self.sent_request_id} if self.sent_request_id else {}
        if self.traceparent is not None:
            sent["traceparent"] = self.traceparent
            if self.tracestate:
                sent["tracestate"] = self.tracestate
        return sent

    def answered(self, upstream_request_id: str | None) -> None:
        """The upstream's own request id (None: it sent none), as the access log may show it;
        each try of the request says it again."""
        self.upstream_request_id = upstream_request_id[:UPSTREAM_ID_LIMIT] if upstream_request_id else None
