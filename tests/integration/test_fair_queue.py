"""The wait queue is fair between keys: a key holding every slot and every place in the queue
does not shut another key out (its newest waiting request gives its place up), and a freed slot
goes to the keys in turn, not to the key that queued first. A real gateway in front of an
upstream whose streams are held open until the client hangs up."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import httpx
import yaml

from gateway.policy.auth import new_key
from tests.support.held_upstream import HeldUpstream
from tests.support.servers import running_gateway

BODY = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}


async def queued(client: httpx.AsyncClient, url: str) -> float:
    text = (await client.get(f"{url}/metrics")).text
    found = re.search(r'^chatgate_requests_queued\{deployment="m"\} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


async def until_queued(client: httpx.AsyncClient, url: str, count: int) -> None:
    for _ in range(200):
        if await queued(client, url) == count:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"never {count} queued")


async def scenario(url: str, key_a: str, key_b: str) -> None:
    async with httpx.AsyncClient(timeout=30) as client:

        async def stream(key: str) -> httpx.Response:
            request = client.build_request(
                "POST", f"{url}/v1/chat/completions", json=BODY, headers={"Authorization": f"Bearer {key}"}
            )
            return await client.send(request, stream=True)

        running = [await stream(key_a), await stream(key_a)]  # a holds both slots
        assert [r.status_code for r in running] == [200, 200]
        a_waiting = []
        for count in range(1, 5):  # and every place in the queue
            a_waiting.append(asyncio.create_task(stream(key_a)))
            await until_queued(client, url, count)
        b = asyncio.create_task(stream(key_b))
        done, _ = await asyncio.wait([*a_waiting, b], timeout=10, return_when=asyncio.FIRST_COMPLETED)
        assert b not in done, "b was refused at once"
        assert done == {a_waiting[-1]}, "a's newest should have given its place up"
        displaced = a_waiting[-1].result()
        assert displaced.status_code == 503
        await displaced.aread()
        assert displaced.json()["error"]["code"] == "QueueFull"
        await until_queued(client, url, 4)  # a's three, and b
        await running[0].aclose()  # a slot frees: b's turn, though a queued first
        answer = await asyncio.wait_for(b, 10)
        assert answer.status_code == 200
        assert not any(task.done() for task in a_waiting[:3])
        await running[1].aclose()  # the next slot: a's turn again
        first_of_a = await asyncio.wait_for(a_waiting[0], 10)
        assert first_of_a.status_code == 200
        for response in [answer, first_of_a]:
            await response.aclose()
        for task in a_waiting[1:3]:
            task.cancel()


def test_one_key_cannot_shut_another_out_of_a_busy_deployment(tmp_path: Path, log_dir: Path) -> None:
    key_a, sha_a = new_key()
    key_b, sha_b = new_key()
    with HeldUpstream() as upstream:
        config = {
            "keys": [{"name": "a", "sha256": sha_a}, {"name": "b", "sha256": sha_b}],
            "deployments": [
                {
                    "name": "m",
                    "backend": "openai-compatible",
                    "options": {"base_url": upstream.base_url(3), "first_byte": 20, "total": 60},
                    "concurrency": {"max_concurrent": 2, "queue": 4, "queue_timeout": 30},
                }
            ],
        }
        path = tmp_path / "config.yaml"
        path.write_text(yaml.safe_dump(config))
        with running_gateway(log_dir, path) as url:
            asyncio.run(scenario(url, key_a, key_b))
