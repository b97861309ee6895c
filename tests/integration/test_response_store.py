"""Stored responses belong to the key that made them: another key reads, deletes, lists and
continues nothing (404), with the memory store on the in-process app and with Redis across two
gateways (either one reads what the other stored). The store's cap and retention let records go;
nothing stored reaches the logs. A WebSocket upgrade on /v1/responses is answered at once, not
with 101."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from asgi_lifespan import LifespanManager

from gateway.app import create_app
from gateway.config.settings import ResponseStoreSettings, Settings
from gateway.policy.auth import new_key
from gateway.policy.response_store import MemoryResponses
from tests.support.fault_upstream import FaultUpstream
from tests.support.redis_server import running_redis
from tests.support.servers import running_gateway

KEY_A, SHA_A = new_key()
KEY_B, SHA_B = new_key()
SECRET = "the-secret-word-is-marmalade"


def settings_dict(redis_url: str | None = None) -> dict:
    settings: dict = {
        "keys": [{"name": "team-a", "sha256": SHA_A}, {"name": "team-b", "sha256": SHA_B}],
        "deployments": [{"name": "echo", "backend": "echo", "models": ["*"]}],
    }
    if redis_url:
        settings["rate_limits"] = {"store": "redis", "redis": {"url": redis_url}}
    return settings


def auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def in_app(scenario: Callable[[httpx.AsyncClient], Awaitable[None]]) -> None:
    """Run a scenario against the in-process app (its memory store), started and stopped."""

    async def run() -> None:
        app = create_app(Settings.model_validate(settings_dict()))
        async with LifespanManager(app) as started:
            transport = httpx.ASGITransport(app=started.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
                await scenario(client)

    asyncio.run(run())


async def create(client: httpx.AsyncClient, key: str, **body: object) -> dict:
    answer = await client.post("/v1/responses", json={"model": "echo", **body}, headers=auth(key))
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_another_key_finds_nothing():
    in_app(_another_key_finds_nothing)


async def _another_key_finds_nothing(client: httpx.AsyncClient):
    mine = await create(client, KEY_A, input=SECRET)
    rid = mine["id"]
    for method, path in [
        ("GET", f"/v1/responses/{rid}"),
        ("GET", f"/v1/responses/{rid}/input_items"),
        ("DELETE", f"/v1/responses/{rid}"),
        ("POST", f"/v1/responses/{rid}/cancel"),
    ]:
        theirs = await client.request(method, path, headers=auth(KEY_B))
        assert theirs.status_code == 404, (method, path, theirs.text)
        assert SECRET not in theirs.text
    continued = await client.post(
        "/v1/responses",
        json={"model": "echo", "input": "go on", "previous_response_id": rid},
        headers=auth(KEY_B),
    )
    assert continued.status_code == 404 and continued.json()["error"]["param"] == "previous_response_id"
    counted = await client.post(
        "/v1/responses/input_tokens", json={"input": "x", "previous_response_id": rid}, headers=auth(KEY_B)
    )
    assert counted.status_code == 404
    # the owner still has all of it
    read = await client.get(f"/v1/responses/{rid}", headers=auth(KEY_A))
    assert read.status_code == 200 and read.json() == mine
    items = (await client.get(f"/v1/responses/{rid}/input_items", headers=auth(KEY_A))).json()
    assert (
        items["data"][0]["content"] == [{"type": "input_text", "text": SECRET}] and items["has_more"] is False
    )
    cancel = await client.post(f"/v1/responses/{rid}/cancel", headers=auth(KEY_A))
    assert cancel.status_code == 400 and "background" in cancel.json()["error"]["message"]
    assert (await client.delete(f"/v1/responses/{rid}", headers=auth(KEY_A))).json() == {
        "id": rid,
        "object": "response",
        "deleted": True,
    }
    assert (await client.get(f"/v1/responses/{rid}", headers=auth(KEY_A))).status_code == 404


def test_a_continued_conversation_is_counted_and_listed():
    in_app(_a_continued_conversation_is_counted_and_listed)


async def _a_continued_conversation_is_counted_and_listed(client: httpx.AsyncClient):
    first = await create(client, KEY_A, input="one two three")
    second = await create(client, KEY_A, input="four", previous_response_id=first["id"])
    assert second["usage"]["input_tokens"] > first["usage"]["input_tokens"]
    counted = await client.post(
        "/v1/responses/input_tokens",
        json={"input": "four", "previous_response_id": first["id"]},
        headers=auth(KEY_A),
    )
    assert counted.status_code == 200 and counted.json()["object"] == "response.input_tokens"
    alone = await client.post("/v1/responses/input_tokens", json={"input": "four"}, headers=auth(KEY_A))
    assert counted.json()["input_tokens"] > alone.json()["input_tokens"]
    third = await create(
        client,
        KEY_A,
        input=[{"role": "user", "content": "five"}, {"role": "user", "content": "six"}],
        previous_response_id=second["id"],
    )
    listed = (
        await client.get(f"/v1/responses/{third['id']}/input_items?order=asc&limit=1", headers=auth(KEY_A))
    ).json()
    assert [item["content"][0]["text"] for item in listed["data"]] == ["five"] and listed["has_more"] is True
    after = listed["last_id"]
    rest = (
        await client.get(
            f"/v1/responses/{third['id']}/input_items?order=asc&after={after}", headers=auth(KEY_A)
        )
    ).json()
    assert [item["content"][0]["text"] for item in rest["data"]] == ["six"]


def test_a_streamed_response_is_stored_before_it_ends():
    in_app(_a_streamed_response_is_stored_before_it_ends)


def test_an_item_reference_names_a_stored_item():
    in_app(_an_item_reference_names_a_stored_item)


async def _an_item_reference_names_a_stored_item(client: httpx.AsyncClient):
    first = await create(client, KEY_A, input="remember the colour teal")
    said = first["output"][0]["id"]
    second = await create(
        client,
        KEY_A,
        input=[{"type": "item_reference", "id": said}, {"role": "user", "content": "and?"}],
        previous_response_id=first["id"],
    )
    listed = (
        await client.get(f"/v1/responses/{second['id']}/input_items?order=asc", headers=auth(KEY_A))
    ).json()
    assert listed["data"][0]["id"] == said and listed["data"][0]["role"] == "assistant"
    unknown = await client.post(
        "/v1/responses",
        json={"model": "echo", "input": [{"type": "item_reference", "id": "msg_nothing"}]},
        headers=auth(KEY_A),
    )
    assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "input.0"


async def _a_streamed_response_is_stored_before_it_ends(client: httpx.AsyncClient):
    async with client.stream(
        "POST", "/v1/responses", json={"model": "echo", "input": "hi", "stream": True}, headers=auth(KEY_A)
    ) as answer:
        text = "".join([chunk async for chunk in answer.aiter_text()])
    rid = text.split('"id":"', 1)[1].split('"', 1)[0]
    read = await client.get(f"/v1/responses/{rid}", headers=auth(KEY_A))
    assert read.status_code == 200 and read.json()["status"] == "completed"


def test_the_memory_store_lets_the_oldest_go_past_its_cap_and_forgets_past_its_age():
    asyncio.run(_memory_store_cap_and_age())


async def _memory_store_cap_and_age() -> None:
    now = [0.0]
    store = MemoryResponses(ResponseStoreSettings(ttl=10, max_bytes=100), clock=lambda: now[0])
    await store.put("a", "r1", {"x": "a" * 40})
    await store.put("a", "r2", {"x": "b" * 40})
    await store.put("a", "r3", {"x": "c" * 40})  # past 100 bytes: r1 goes
    assert await store.get("a", "r1") is None
    assert await store.get("a", "r3") == {"x": "c" * 40}
    assert await store.get("b", "r3") is None  # another owner
    assert store.size <= 100
    now[0] = 11.0
    assert await store.get("a", "r3") is None
    await store.put("a", "big", {"x": "d" * 200})  # larger than the whole store: not kept
    assert await store.get("a", "big") is None


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory) -> Iterator[str]:
    with running_redis(tmp_path_factory.mktemp("redis")) as (url, _process):
        yield url


def test_redis_shares_them_between_gateways_and_keeps_keys_apart(
    tmp_path: Path, log_dir: Path, redis_url: str
):
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(settings_dict(redis_url)))
    with running_gateway(log_dir, config) as one, running_gateway(log_dir, config) as two:
        made = httpx.post(
            f"{one}/v1/responses", json={"model": "echo", "input": SECRET}, headers=auth(KEY_A), timeout=10
        )
        rid = made.json()["id"]
        read = httpx.get(f"{two}/v1/responses/{rid}", headers=auth(KEY_A), timeout=10)
        assert read.status_code == 200 and read.json()["output_text"] == made.json()["output_text"]
        continued = httpx.post(
            f"{two}/v1/responses",
            json={"model": "echo", "input": "go on", "previous_response_id": rid},
            headers=auth(KEY_A),
            timeout=10,
        )
        assert continued.status_code == 200
        for url in (one, two):
            assert httpx.get(f"{url}/v1/responses/{rid}", headers=auth(KEY_B), timeout=10).status_code == 404
            assert (
                httpx.delete(f"{url}/v1/responses/{rid}", headers=auth(KEY_B), timeout=10).status_code == 404
            )
            assert (
                httpx.get(
                    f"{url}/v1/responses/{rid}/input_items", headers=auth(KEY_B), timeout=10
                ).status_code
                == 404
            )
            refused = httpx.post(
                f"{url}/v1/responses",
                json={"model": "echo", "input": "x", "previous_response_id": rid},
                headers=auth(KEY_B),
                timeout=10,
            )
            assert refused.status_code == 404
        assert httpx.delete(f"{two}/v1/responses/{rid}", headers=auth(KEY_A), timeout=10).status_code == 200
        assert httpx.get(f"{one}/v1/responses/{rid}", headers=auth(KEY_A), timeout=10).status_code == 404
    logs = "".join(path.read_text(errors="replace") for path in log_dir.glob("gateway-*.log"))
    assert SECRET not in logs


def test_a_websocket_upgrade_is_answered_at_once_without_101(gateway_url: str):
    host, port = gateway_url.removeprefix("http://").split(":")
    started = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=5) as connection:
        connection.sendall(
            b"GET /v1/responses HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
            b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            b"openai-beta: responses_websockets=2026-02-06\r\n\r\n"
        )
        head = connection.recv(4096)
    assert time.monotonic() - started < 2
    status = int(head.split(b" ", 2)[1])
    assert status != 101 and 400 <= status < 500, head
    assert b'"error"' in head or b"\r\n\r\n" in head


def test_a_stream_the_upstream_cuts_ends_with_an_error_event_and_stores_nothing(
    tmp_path: Path, log_dir: Path
):
    with FaultUpstream() as upstream:
        config = tmp_path / "config.yaml"
        deployment = {
            "name": "cut",
            "backend": "openai-compatible",
            "options": {"base_url": upstream.base_url("reset")},
            "health": {"failures": 1000},
        }
        config.write_text(yaml.safe_dump({"deployments": [deployment]}))
        with running_gateway(log_dir, config) as url:
            body = {"model": "cut", "input": "hi", "stream": True}
            answer = httpx.post(f"{url}/v1/responses", json=body, timeout=30)
            frames = [frame for frame in answer.text.split("\n\n") if frame.strip()]
            rid = answer.text.split('"id":"', 1)[1].split('"', 1)[0]
            stored = httpx.get(f"{url}/v1/responses/{rid}", timeout=10)
    assert answer.status_code == 200
    assert frames[0].startswith("event: response.created")
    assert frames[-1].startswith("event: error")
    error = json.loads(frames[-1].split("data: ", 1)[1])
    assert set(error) == {"type", "code", "message", "param", "sequence_number"}
    numbers = [json.loads(frame.split("data: ", 1)[1])["sequence_number"] for frame in frames]
    assert numbers == list(range(len(frames)))
    assert stored.status_code == 404  # an answer that failed is not kept
