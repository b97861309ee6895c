"""Changes without a restart, with real processes under load: SIGHUP re-reads the config (a bad
file is refused and logged, the old config keeps serving), the keys file is picked up when it
changes (`chatgate keys new/revoke --file`), counters survive, and no request fails meanwhile."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml

from gateway.policy.auth import new_key
from tests.support.gateway_process import gateway_process
from tests.support.redis_server import running_redis
from tests.support.servers import ROOT

KEY, KEY_SHA = new_key()
PROBE, PROBE_SHA = new_key()  # a key with a tight limit, to see the counters live through reloads
PROBE_LIMIT = 10


def base_config(keys_file: Path, redis_url: str | None = None) -> dict:
    """`redis_url`: the limit store several workers share (with the memory store, a gateway with
    per-key limits refuses to start with more than one worker)."""
    store = {"rate_limits": {"store": "redis", "redis": {"url": redis_url}}} if redis_url else {}
    return store | {
        "keys": [
            {"name": "steady", "sha256": KEY_SHA},
            {"name": "probe", "sha256": PROBE_SHA, "limits": {"requests_per_minute": PROBE_LIMIT}},
        ],
        "keys_file": str(keys_file),
        "deployments": [{"name": "echo", "backend": "echo"}],
    }


class Load:
    """Requests without pause from a thread; every status kept."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.statuses: list[int] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        body = {"model": "echo", "messages": [{"role": "user", "content": "steady"}]}
        with httpx.Client(timeout=10) as client:
            while not self.stopping.is_set():
                try:
                    answer = client.post(
                        f"{self.url}/v1/chat/completions",
                        json=body,
                        headers={"authorization": f"Bearer {KEY}"},
                    )
                    self.statuses.append(answer.status_code)
                except httpx.HTTPError:
                    self.statuses.append(0)

    def __enter__(self) -> Load:
        self.thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stopping.set()
        self.thread.join(30)


def keys_cli(*args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "gateway", "keys", *args], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return result.stdout


def until(condition, timeout: float = 10) -> None:
    ends = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < ends, "timed out"
        time.sleep(0.1)


def remaining(url: str) -> int:
    """The probe key's requests left, after one more."""
    answer = httpx.post(
        f"{url}/v1/chat/completions",
        json={"model": "echo", "messages": [{"role": "user", "content": "count"}]},
        headers={"authorization": f"Bearer {PROBE}"},
    )
    return int(answer.headers["x-ratelimit-remaining-requests"])


@pytest.mark.parametrize("workers", [1, 2])
def test_reloads_under_load_lose_no_request(tmp_path: Path, workers: int):
    keys_file = tmp_path / "keys.yaml"
    keys_file.write_text("[]\n")
    stack = contextlib.ExitStack()
    redis_url = stack.enter_context(running_redis(tmp_path))[0] if workers > 1 else None
    with (
        stack,
        gateway_process(tmp_path, base_config(keys_file, redis_url), "--workers", str(workers)) as gateway,
    ):
        config = next(tmp_path.glob("chatgate-*.yaml"))
        with Load(gateway.url) as load:
            until(lambda: len(load.statuses) > 20)
            for _ in range(5):
                before = remaining(gateway.url)

            # a new deployment, by SIGHUP
            grown = base_config(keys_file, redis_url)
            grown["deployments"].append({"name": "second", "backend": "echo"})
            config.write_text(yaml.safe_dump(grown))
            gateway.signal(signal.SIGHUP)
            second = {"model": "second", "messages": [{"role": "user", "content": "hi"}]}
            headers = {"authorization": f"Bearer {KEY}"}
            url = f"{gateway.url}/v1/chat/completions"
            until(lambda: httpx.post(url, json=second, headers=headers).json().get("model") == "second")
            # every worker has it (each reloads on its own: the bad file below must not reach one
            # that has not yet, which would keep the config from before, without `second`)
            grown_line = f"({len(grown['deployments'])} deployments"
            until(lambda: sum(grown_line in line for line in gateway.output().splitlines()) >= workers)

            # a bad file is refused; what runs keeps running
            config.write_text("deployments: [{name: broken, backend: nonsense}]\n")
            gateway.signal(signal.SIGHUP)
            until(lambda: "reload refused" in gateway.output())
            assert (
                httpx.post(f"{gateway.url}/v1/chat/completions", json=second, headers=headers).status_code
                == 200
            )
            config.write_text(yaml.safe_dump(grown))

            # a key added to the keys file works without a signal; revoked, it stops
            carol = key_of(keys_cli("new", "carol", "--file", str(keys_file)))
            carol_headers = {"authorization": f"Bearer {carol}"}
            chat = {"model": "echo", "messages": [{"role": "user", "content": "hi"}]}

            def carol_answers(status: int) -> bool:
                # with workers, each must have reloaded: ask a few times
                return all(
                    httpx.post(url, json=chat, headers=carol_headers).status_code == status for _ in range(6)
                )

            until(lambda: carol_answers(200))
            keys_cli("revoke", "carol", "--file", str(keys_file))
            until(lambda: carol_answers(401))
            after = remaining(gateway.url)

    assert load.statuses and set(load.statuses) == {200}, sorted(set(load.statuses))
    if workers == 1:  # the counters lived through four reloads (in memory: one process)
        assert before == PROBE_LIMIT - 5
        assert after <= before + 2, (before, after)  # one more taken; a few refilled meanwhile


def key_of(printed: str) -> str:
    return printed.split("store it now): ")[1].split()[0]


def test_an_expired_key_is_refused(tmp_path: Path):
    keys_file = tmp_path / "keys.yaml"
    keys_file.write_text("[]\n")
    old = key_of(keys_cli("new", "old", "--file", str(keys_file), "--expires", "2020-01-01"))
    fresh = key_of(keys_cli("new", "fresh", "--file", str(keys_file), "--expires", "2099-01-01"))
    chat = {"model": "echo", "messages": [{"role": "user", "content": "hi"}]}
    with gateway_process(tmp_path, base_config(keys_file)) as gateway:
        url = f"{gateway.url}/v1/chat/completions"
        assert httpx.post(url, json=chat, headers={"authorization": f"Bearer {fresh}"}).status_code == 200
        refused = httpx.post(url, json=chat, headers={"authorization": f"Bearer {old}"})
    assert refused.status_code == 401 and "expired" in refused.json()["error"]["message"]
    listed = keys_cli("list", "--file", str(keys_file))
    assert "old" in listed and "2020-01-01" in listed
