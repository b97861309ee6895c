"""A keys file of 20,000 keys: the gateway starts with it, a change to it is read off the event
loop (the gateway keeps answering while seconds of YAML are parsed), and the new key works."""

from __future__ import annotations

import hashlib
import signal
import threading
import time
from pathlib import Path

import httpx
import yaml

from gateway.policy.auth import new_key
from tests.support.gateway_process import gateway_process

KEYS = 20_000


def entries(count: int) -> list[dict[str, str]]:
    return [{"name": f"k{i}", "sha256": hashlib.sha256(b"%d" % i).hexdigest()} for i in range(count)]


def write(path: Path, keys: list[dict[str, str]]) -> None:
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    path.write_text(yaml.dump(keys, Dumper=dumper, sort_keys=False))


def test_a_change_to_a_large_keys_file_stalls_nothing(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.yaml"
    listed = entries(KEYS)
    write(keys_file, listed)
    key, sha = new_key()
    config = {"keys_file": str(keys_file), "deployments": [{"name": "echo", "backend": "echo"}]}
    with gateway_process(tmp_path, config) as gateway:
        ask = {"model": "echo", "messages": [{"role": "user", "content": "hi"}]}
        with_key = {"Authorization": f"Bearer {key}"}
        assert httpx.post(f"{gateway.url}/v1/chat/completions", json=ask, headers=with_key).status_code == 401
        write(keys_file, [*listed, {"name": "new", "sha256": sha}])
        slowest = 0.0
        done = threading.Event()

        def poll() -> None:
            nonlocal slowest
            with httpx.Client(timeout=60) as client:
                while not done.is_set():
                    started = time.perf_counter()
                    assert client.get(f"{gateway.url}/health").status_code == 200
                    slowest = max(slowest, time.perf_counter() - started)
                    time.sleep(0.02)

        poller = threading.Thread(target=poll)
        poller.start()
        try:
            gateway.signal(signal.SIGHUP)
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                url = f"{gateway.url}/v1/chat/completions"
                answer = httpx.post(url, json=ask, headers=with_key, timeout=60)
                if answer.status_code == 200:
                    break
                time.sleep(0.2)
            assert answer.status_code == 200, gateway.output()[-2000:]
        finally:
            done.set()
            poller.join()
        # parsing 20,000 keys takes seconds here; the loop was never held for more than a blink
        assert slowest < 1.0, f"/health took {slowest:.2f} s during the reload"
        assert f"{KEYS + 1} keys" in gateway.output()
