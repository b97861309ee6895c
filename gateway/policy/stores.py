"""The limit store the settings ask for: this process's memory, or a Redis every gateway shares."""

from __future__ import annotations

from gateway.config import RateLimiting
from gateway.policy.limits import Limiter, MemoryLimiter
from gateway.policy.redis_limiter import RedisLimiter


def create_limiter(settings: RateLimiting) -> Limiter:
    if settings.store == "redis" and settings.redis is not None:
        return RedisLimiter(settings.redis)
    return MemoryLimiter()
