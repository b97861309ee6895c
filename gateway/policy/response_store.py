"""Where the Responses API's stored responses live (gateway.dialects.dialect.ResponseStore): this
process's memory, bounded in bytes and by age and forgotten on restart, or the Redis the rate
limits use, where every replica sees them. Records are kept under their owner (a key's identity),
so another key's read, delete or continuation finds nothing. Nothing stored is ever logged."""

from __future__ import annotations

import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import orjson

from gateway.config.settings import RedisLimits, ResponseStoreSettings, Settings
from gateway.core.errors import ServiceUnavailable

log = logging.getLogger("chatgate")


def slot(owner: str, record_id: str) -> str:
    """A record's place: its owner and id, hashed together (ids and keys never appear in keys)."""
    return hashlib.sha256(f"{owner}\0{record_id}".encode()).hexdigest()


class MemoryResponses:
    """Records in this process, the oldest let go first past `max_bytes`, each for `ttl` seconds."""

    def __init__(self, settings: ResponseStoreSettings, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = settings.ttl
        self.max_bytes = settings.max_bytes
        self.clock = clock
        self.records: OrderedDict[str, tuple[float, bytes]] = OrderedDict()  # slot → (expiry, JSON)
        self.size = 0

    async def get(self, owner: str, record_id: str) -> Any | None:
        key = slot(owner, record_id)
        found = self.records.get(key)
        if found is None:
            return None
        if found[0] <= self.clock():
            self.drop(key)
            return None
        return orjson.loads(found[1])

    async def put(self, owner: str, record_id: str, record: Any) -> None:
        data = orjson.dumps(record)
        key = slot(owner, record_id)
        self.drop(key)
        if len(data) > self.max_bytes:
            return  # larger than the whole store: not kept (a later read answers 404)
        self.records[key] = (self.clock() + self.ttl, data)
        self.size += len(data)
        now = self.clock()
        while self.size > self.max_bytes or (self.records and next(iter(self.records.values()))[0] <= now):
            self.drop(next(iter(self.records)))

    async def delete(self, owner: str, record_id: str) -> bool:
        key = slot(owner, record_id)
        found = self.records.get(key)
        self.drop(key)
        return found is not None and found[0] > self.clock()

    def drop(self, key: str) -> None:
        found = self.records.pop(key, None)
        if found is not None:
            self.size -= len(found[1])

    async def aclose(self) -> None:
        self.records.clear()
        self.size = 0


class RedisResponses:
    """Records in Redis, each a string under the prefix that expires after `ttl` seconds."""

    def __init__(self, settings: ResponseStoreSettings, redis_settings: RedisLimits) -> None:
        import redis.asyncio as redis

        self.client = redis.Redis.from_url(
            redis_settings.url,
            socket_connect_timeout=redis_settings.timeout,
            socket_timeout=max(redis_settings.timeout, 2.0),
            max_connections=redis_settings.max_connections,
        )
        self.prefix = settings.prefix
        self.ttl = max(1, int(settings.ttl))

    async def call(self, method: str, *args: Any) -> Any:
        import redis.exceptions

        try:
            return await getattr(self.client, method)(*args)
        except (redis.exceptions.RedisError, OSError) as error:
            log.warning("response store: Redis did not answer (%s)", type(error).__name__)
            raise ServiceUnavailable(
                "The response store is not reachable; try again shortly.", code="store_unavailable"
            ) from None

    async def get(self, owner: str, record_id: str) -> Any | None:
        data = await self.call("get", self.prefix + slot(owner, record_id))
        return None if data is None else orjson.loads(data)

    async def put(self, owner: str, record_id: str, record: Any) -> None:
        await self.call("set", self.prefix + slot(owner, record_id), orjson.dumps(record), self.ttl)

    async def delete(self, owner: str, record_id: str) -> bool:
        return bool(await self.call("delete", self.prefix + slot(owner, record_id)))

    async def aclose(self) -> None:
        await self.client.aclose()


def create_response_store(settings: Settings) -> MemoryResponses | RedisResponses:
    limits = settings.rate_limits
    if limits.store == "redis" and limits.redis is not None:
        return RedisResponses(settings.responses, limits.redis)
    return MemoryResponses(settings.responses)
