"""What the server tells the app about its own life: whether it is draining (read by /ready)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Lifecycle:
    draining: bool = False
