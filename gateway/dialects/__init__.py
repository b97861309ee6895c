"""One module per dialect; each holds that dialect's whole story (reading, rules, rendering)."""

from gateway.dialects.aleph_alpha import AlephAlpha
from gateway.dialects.azure import Azure
from gateway.dialects.lmi import LMI
from gateway.dialects.openai import OpenAI
from gateway.dialects.ovms import OVMS

DIALECTS = (OpenAI, Azure, AlephAlpha, LMI, OVMS)

__all__ = ["DIALECTS", "LMI", "OVMS", "AlephAlpha", "Azure", "OpenAI"]
