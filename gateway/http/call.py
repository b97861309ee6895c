"""One request as the front door hands it to its operation's handler: everything the handler
may read, in one explicit object (nothing rides in the ASGI scope)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from starlette.types import Receive

from gateway.core.disconnect import ClientWatch
from gateway.policy.auth import Caller
from gateway.telemetry.record import RequestRecord


@dataclass(slots=True)
class Call:
    request_id: str
    headers: dict[str, str]  # lower-case names
    caller: Caller
    record: RequestRecord
    receive: Receive  # to hear the client go away
    client: ClientWatch | None = None  # the connection's watch, behind the gateway's edge
    body: Any = None  # the JSON body, valid for the operation's document
    query: dict[str, str] = field(default_factory=dict)
    path_params: dict[str, str] = field(default_factory=dict)
