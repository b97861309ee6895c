"""The probe sets, by name: each in its module, with its requests in its own shape, its error
schema and its stream framing. A dialect names the set it is probed with (`Dialect.probes`):
its own, or that of a dialect whose shape it shares."""

from __future__ import annotations

from gateway.dialects.registry import DIALECTS
from gateway.probes.aleph_alpha import ALEPH_ALPHA
from gateway.probes.azure import AZURE
from gateway.probes.lmi import LMI
from gateway.probes.openai import OPENAI
from gateway.probes.ovms import OVMS
from gateway.probes.probe_set import ProbeSet
from gateway.probes.responses import RESPONSES

PROBE_SETS: dict[str, ProbeSet] = {s.dialect: s for s in (OPENAI, AZURE, ALEPH_ALPHA, LMI, OVMS, RESPONSES)}


def own_chat_sets() -> set[str]:
    """The probe sets chat operations of their own shape name (`OwnChat.probes`: `responses`),
    probed by that name under their dialect's mount."""
    return {own.probes for d in DIALECTS.values() for own in d.own_chat.values() if own.probes is not None}


def probe_set_of(dialect: str) -> ProbeSet | None:
    """The probe set a registered dialect is probed with; None for a dialect that names none (or
    is not registered): a command says it is not probed, it never fails on it."""
    registered = DIALECTS.get(dialect)
    if registered is None and dialect in own_chat_sets():
        return PROBE_SETS.get(dialect)
    if registered is None or registered.probes is None:
        return None
    return PROBE_SETS.get(registered.probes)


def probed_dialects() -> list[str]:
    """The registered dialects that have a probe set."""
    return [name for name in DIALECTS if probe_set_of(name) is not None] + sorted(own_chat_sets())
