"""The limit store the settings ask for: this process's memory, or a Redis every gateway shares."""

from __future__ import annotations

import time
from collections.abc import Callable

from gateway.config.settings import RateLimiting, Settings
from gateway.policy.limits import Limiter, MemoryLimiter
from gateway.policy.redis_limiter import RedisLimiter


def shared(settings: RateLimiting) -> bool:
    """Whether the counters live where every process sees them (Redis)."""
    return settings.store == "redis" and settings.redis is not None


def create_limiter(settings: RateLimiting, clock: Callable[[], float] = time.time) -> Limiter:
    """`clock`: this host's time (a test skews it); Redis's own clock rules its budget periods."""
    if settings.store == "redis" and settings.redis is not None:
        return RedisLimiter(settings.redis, clock)
    return MemoryLimiter(clock)


def split_between_workers(settings: Settings, workers: int) -> str | None:
    """Why these settings cannot run in `workers` processes, in one line; None when they can.

    In memory each worker keeps its own counters, so every limit and budget would let through
    `workers` times its amount. A gateway without limits or budgets has nothing to split."""
    if workers <= 1 or shared(settings.rate_limits):
        return None
    limited = [
        f"key '{key.name}'"
        for key in settings.keys
        if key.budgets or key.limits.requests_per_minute or key.limits.tokens_per_minute
    ] + [
        f"deployment '{deployment.name}'"
        for deployment in settings.deployments
        if deployment.limits.requests_per_minute or deployment.limits.tokens_per_minute
    ]
    if not limited:
        return None
    more = f" (and {len(limited) - 1} more)" if len(limited) > 1 else ""
    return (
        f"--workers {workers} with rate_limits.store: memory would give each worker its own count "
        f"of the limits and budgets of {limited[0]}{more}: use rate_limits.store: redis, or --workers 1"
    )
