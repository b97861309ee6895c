"""The probe sets, by dialect. Another dialect's set (its requests in its own shape, its error
schema, its stream framing) is a module beside `openai.py`, named here."""

from __future__ import annotations

from gateway.probes.openai import OPENAI
from gateway.probes.probe_set import ProbeSet

PROBE_SETS: dict[str, ProbeSet] = {OPENAI.dialect: OPENAI}
