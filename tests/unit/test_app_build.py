"""The ASGI app through Connexion's public surface: Connexion builds its middleware stack on the
lifespan startup, so the front door's tables are compiled before the first request, and the
front door attaches itself to the current runtime; a reload hands it the new keys explicitly."""

from __future__ import annotations

import asyncio

import httpx
from asgi_lifespan import LifespanManager

from gateway.app import build_gateway
from gateway.config.settings import Key, Settings
from gateway.http.lifecycle import Lifecycle
from gateway.policy.auth import new_key

KEY, KEY_SHA = new_key()
_, OTHER_SHA = new_key()
BODY = {"model": "echo", "messages": [{"role": "user", "content": "hi"}]}


def test_the_front_door_is_built_on_the_startup_and_takes_a_reloads_keys():
    lifecycle = Lifecycle()
    gateway = build_gateway(Settings(keys=[Key(name="old", sha256=KEY_SHA)]), lifecycle=lifecycle)
    assert gateway.current.front_door is None  # nothing built before the server starts it

    async def run() -> tuple[int, int, int]:
        async with LifespanManager(gateway.app) as started:
            front_door = gateway.current.front_door
            assert front_door is not None and front_door.exact  # compiled, before any request
            assert "/health" in front_door.exact  # the gateway's own endpoints joined it
            transport = httpx.ASGITransport(app=started.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
                headers = {"authorization": f"Bearer {KEY}"}
                before = await client.post("/v1/chat/completions", json=BODY, headers=headers)
                assert front_door.key_store is gateway.current.runtime.keys
                await lifecycle.reload(Settings(keys=[Key(name="new", sha256=OTHER_SHA)]))
                assert front_door.key_store is gateway.current.runtime.keys  # handed over by use()
                after = await client.post("/v1/chat/completions", json=BODY, headers=headers)
                health = await client.get("/health")
            return before.status_code, after.status_code, health.status_code

    assert asyncio.run(run()) == (200, 401, 200)
