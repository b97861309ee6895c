"""A gateway that requires keys never becomes open by a change of files, with real processes:
the last key revoked, a config file caught half-written (empty, or cut short), a config that no
longer names keys, a worker replaced after a revocation. Each of these let every request through
before (issue 24, findings 1-3)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from gateway.policy.auth import new_key
from tests.support.gateway_process import GatewayProcess, gateway_process
from tests.support.servers import ROOT

pytestmark = pytest.mark.slow  # out of the fast lane (docs/development/tests.md)

KEY, KEY_SHA = new_key()
OTHER, OTHER_SHA = new_key()
NONSENSE = "cg-" + "x" * 43
BODY = {"model": "echo", "messages": [{"role": "user", "content": "hello"}]}
WATCH = 2.0  # the gateway looks at its files this often


def status(url: str, key: str | None) -> int:
    """One request on a fresh connection (so that, with several workers, each may answer)."""
    headers = {"authorization": f"Bearer {key}"} if key is not None else {}
    with httpx.Client(timeout=10) as client:
        return client.post(f"{url}/v1/chat/completions", json=BODY, headers=headers).status_code


def statuses(url: str, key: str | None, times: int) -> list[int]:
    return [status(url, key) for _ in range(times)]


def until(condition, timeout: float = 15) -> None:
    ends = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < ends, "timed out"
        time.sleep(0.1)


def keys_cli(*args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "gateway", "keys", *args], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return result.stdout


def config_path(gateway: GatewayProcess) -> Path:
    command = Path(f"/proc/{gateway.process.pid}/cmdline").read_bytes().split(b"\0")
    return Path(command[command.index(b"--config") + 1].decode())


def stays_closed(url: str, seconds: float) -> None:
    """For `seconds` (more than a look at the files), nothing gets in without a good key."""
    ends = time.monotonic() + seconds
    while time.monotonic() < ends:
        assert status(url, None) == 401
        assert status(url, NONSENSE) == 401
        time.sleep(0.2)


def test_revoking_the_last_key_refuses_everyone(tmp_path: Path):
    keys_file = tmp_path / "keys.yaml"
    keys_file.write_text(yaml.safe_dump([{"name": "only", "sha256": KEY_SHA}]))
    config = {"keys_file": str(keys_file), "deployments": [{"name": "echo", "backend": "echo"}]}
    with gateway_process(tmp_path, config) as gateway:
        assert status(gateway.url, KEY) == 200
        assert status(gateway.url, None) == 401
        printed = keys_cli("revoke", "only", "--file", str(keys_file))
        assert yaml.safe_load(keys_file.read_text()) == []
        until(lambda: status(gateway.url, KEY) == 401)
        stays_closed(gateway.url, 2 * WATCH)
        assert status(gateway.url, KEY) == 401
        assert "no keys left" in gateway.output()
        assert "last key" in printed


def keyed_config(tmp_path: Path) -> dict:
    return {
        "deployments": [{"name": "echo", "backend": "echo"}],
        "keys": [{"name": "inline", "sha256": KEY_SHA}],
    }


@pytest.mark.parametrize(
    "written",
    [
        pytest.param("", id="empty"),
        pytest.param("deployments:\n", id="cut-after-deployments"),
        pytest.param("deployments:\n  - name: echo\n    backend: echo\n", id="cut-before-keys"),
        pytest.param("# being written\n", id="only-a-comment"),
    ],
)
def test_a_half_written_config_leaves_the_gateway_closed(tmp_path: Path, written: str):
    with gateway_process(tmp_path, keyed_config(tmp_path)) as gateway:
        path = config_path(gateway)
        whole = path.read_text()
        assert status(gateway.url, None) == 401
        with path.open("w") as handle:  # written in place, not renamed over: a reader may see this
            handle.write(written)
        until(lambda: "reload refused" in gateway.output())
        stays_closed(gateway.url, 1.5 * WATCH)
        assert status(gateway.url, KEY) == 200
        # then the whole file lands: it is read (its bytes differ from what was refused)
        path.write_text(whole.replace("inline", "inline-again"))
        until(lambda: "reloaded" in gateway.output())
        stays_closed(gateway.url, 0.5)
        assert status(gateway.url, KEY) == 200
        assert gateway.output().count("reload refused") == 1  # logged once, not at every look


def test_the_whole_file_is_read_even_when_its_time_did_not_change(tmp_path: Path):
    """The watcher compares what the files hold, not their modification times: the whole file
    landing in the same clock tick as the half-written one (coarse timestamps, a fast writer) is
    still read. Comparing times around a reload, the gateway loaded the empty file and never
    looked again: open for good, the whole keyed file on disk."""
    with gateway_process(tmp_path, keyed_config(tmp_path)) as gateway:
        path = config_path(gateway)
        whole = path.read_text().replace("inline", "inline-again")
        with path.open("w") as handle:
            handle.write("")
        tick = path.stat().st_mtime_ns
        time.sleep(1.5 * WATCH)  # looked at, empty
        path.write_text(whole)
        os.utime(path, ns=(tick, tick))
        until(lambda: "reloaded" in gateway.output())
        stays_closed(gateway.url, 0.5)
        assert status(gateway.url, KEY) == 200


def test_a_config_without_keys_opens_the_gateway_only_when_it_says_so(tmp_path: Path):
    with gateway_process(tmp_path, keyed_config(tmp_path)) as gateway:
        path = config_path(gateway)
        path.write_text(yaml.safe_dump({"deployments": [{"name": "echo", "backend": "echo"}]}))
        until(lambda: "reload refused" in gateway.output())
        assert "auth: none" in gateway.output()
        stays_closed(gateway.url, 1.5 * WATCH)
        path.write_text(
            yaml.safe_dump({"auth": "none", "deployments": [{"name": "echo", "backend": "echo"}]})
        )
        until(lambda: status(gateway.url, None) == 200)


def test_a_duplicated_section_is_refused_not_read_as_the_last(tmp_path: Path):
    """PyYAML keeps the last of two equal keys: a second, empty `keys:` dropped every key."""
    with gateway_process(tmp_path, keyed_config(tmp_path)) as gateway:
        path = config_path(gateway)
        path.write_text(path.read_text() + "keys: []\n")
        until(lambda: "reload refused" in gateway.output())
        assert "'keys' is given twice" in gateway.output()
        stays_closed(gateway.url, 1.5 * WATCH)


def workers_of(supervisor: int) -> set[int]:
    found = set()
    for child in Path(f"/proc/{supervisor}/task/{supervisor}/children").read_text().split():
        command = Path(f"/proc/{child}/cmdline").read_bytes()
        if b"spawn_main" in command:
            found.add(int(child))
    return found


def test_a_worker_started_after_a_revocation_refuses_the_key(tmp_path: Path):
    keys_file = tmp_path / "keys.yaml"
    keys_file.write_text(
        yaml.safe_dump([{"name": "revoked", "sha256": KEY_SHA}, {"name": "kept", "sha256": OTHER_SHA}])
    )
    config = {"keys_file": str(keys_file), "deployments": [{"name": "echo", "backend": "echo"}]}
    with gateway_process(tmp_path, config, "--workers", "2") as gateway:
        workers = workers_of(gateway.process.pid)
        assert len(workers) == 2
        keys_cli("revoke", "revoked", "--file", str(keys_file))
        until(lambda: statuses(gateway.url, KEY, 20) == [401] * 20)
        time.sleep(WATCH + 0.5)  # every process has looked at the files since
        for victim in workers:
            os.kill(victim, signal.SIGKILL)
            until(
                lambda victim=victim: (
                    victim not in workers_of(gateway.process.pid)
                    and len(workers_of(gateway.process.pid)) == 2
                )
            )
            until(lambda: status(gateway.url, OTHER) == 200)
        assert workers_of(gateway.process.pid).isdisjoint(workers)
        answers = statuses(gateway.url, KEY, 40)
        assert answers == [401] * 40, f"the revoked key got in {answers.count(200)} times in 40"
        assert statuses(gateway.url, OTHER, 10) == [200] * 10
