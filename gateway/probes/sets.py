"""The probe sets, by dialect: each in its module, with its requests in its own shape, its
error schema and its stream framing."""

from __future__ import annotations

from gateway.probes.aleph_alpha import ALEPH_ALPHA
from gateway.probes.azure import AZURE
from gateway.probes.lmi import LMI
from gateway.probes.openai import OPENAI
from gateway.probes.ovms import OVMS
from gateway.probes.probe_set import ProbeSet

PROBE_SETS: dict[str, ProbeSet] = {s.dialect: s for s in (OPENAI, AZURE, ALEPH_ALPHA, LMI, OVMS)}
