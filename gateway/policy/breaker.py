"""A circuit breaker around a dependency the gateway can run without (the rate-limit store).

Closed: calls go through. After `failures` failures in a row it opens: calls fail at once,
without waiting on a dependency that is hung. After `reset_after` seconds one call is let through
as a probe; its success closes the breaker, its failure opens it again. Each change of state is
logged once: a dependency's outage costs one timeout per interval and a few log lines, not one
of each per request.
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger("chatgate.breaker")


class Breaker:
    def __init__(self, name: str, failures: int, reset_after: float) -> None:
        self.name = name
        self.failures_to_open = failures
        self.reset_after = reset_after
        self.failures = 0
        self.opened_at: float | None = None
        self.probing = False

    @property
    def open(self) -> bool:
        return self.opened_at is not None

    def allows(self) -> bool:
        """Whether a call may go to the dependency now (closed, or this call is the probe)."""
        if self.opened_at is None:
            return True
        if not self.probing and time.monotonic() - self.opened_at >= self.reset_after:
            self.probing = True
            return True
        return False

    def untold(self) -> None:
        """A call let through ended without an answer either way (no connection came free, or its
        request was cancelled): it says nothing of the dependency, and had it been the probe,
        the next call probes instead of the breaker staying open for good."""
        self.probing = False

    def succeeded(self) -> None:
        self.failures = 0
        self.probing = False
        if self.opened_at is not None:
            self.opened_at = None
            log.warning("%s answers again: breaker closed", self.name)

    def failed(self, error: BaseException) -> None:
        self.failures += 1
        if self.probing:  # the probe failed: stay open for another interval
            self.probing = False
            self.opened_at = time.monotonic()
        elif self.opened_at is None and self.failures >= self.failures_to_open:
            self.opened_at = time.monotonic()
            log.error(
                "%s failed %d times in a row (%s): breaker open, next try in %gs",
                self.name, self.failures, error, self.reset_after,
            )  # fmt: skip
