"""The extra-parameters policy: what happens to request parameters the dialect's spec does not define."""

from __future__ import annotations

from gateway.config.settings import ExtraParamsPolicy
from gateway.core.canonical import ChatRequest
from gateway.core.errors import BadRequest

HEADER = "extra-parameters"
# The answer to a request whose extra parameters were dropped names them: nothing in silence.
DROPPED_HEADER = "x-chatgate-dropped-params"
# The seed document calls `drop` "ignore"; the real service says `drop`. Both are accepted.
ALIASES: dict[str, ExtraParamsPolicy] = {
    "pass-through": "pass-through",
    "drop": "drop",
    "ignore": "drop",
    "error": "error",
}


def resolve_policy(header_value: str | None, default: ExtraParamsPolicy) -> ExtraParamsPolicy:
    if header_value is None:
        return default
    policy = ALIASES.get(header_value.strip().lower())
    if policy is None:
        raise BadRequest(
            f"Invalid value '{header_value}' for header '{HEADER}'. Valid values: {', '.join(ALIASES)}.",
            param=HEADER,
            loc=["header", HEADER],
            value=header_value,
        )
    return policy


def apply_extra_params(request: ChatRequest, policy: ExtraParamsPolicy) -> list[str]:
    """Keep, drop or refuse `request.extra` as the policy says; the names it dropped, sorted."""
    if not request.extra:
        return []
    if policy == "drop":
        dropped = sorted(request.extra)
        request.extra = {}
        return dropped
    elif policy == "error":
        names = sorted(request.extra)
        raise BadRequest(
            f"Extra parameters {names} are not allowed when '{HEADER}' is 'error' "
            f"(send '{HEADER}: pass-through' or 'drop' to change this).",
            param=names[0],
            loc=["body", names[0]],
            value=request.extra[names[0]],
            code="ExtraParameterNotAllowed",
        )
    return []


DROPPED_HEADER_BYTES = 2048  # a longer list is cut, ending in "..."


def dropped_header(names: list[str]) -> bytes:
    """The dropped names as a header value: printable ASCII only (control characters and
    non-ASCII escaped as Python writes them, so no name can break the header), bounded."""
    shown = ", ".join(names).encode("unicode_escape")
    if len(shown) > DROPPED_HEADER_BYTES:
        shown = shown[: DROPPED_HEADER_BYTES - 3] + b"..."
    return shown
