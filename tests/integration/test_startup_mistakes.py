"""Every start-up mistake stops `chatgate serve` with one line naming what is wrong and exit 2:
no traceback, no worker respawned forever. `chatgate config check` says the same without serving."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from tests.support.servers import ROOT, free_port, wait_until_healthy

pytestmark = pytest.mark.slow  # out of the fast lane (docs/development/tests.md)

USER = [{"role": "user", "content": "hi"}]
ECHO = {"name": "echo", "backend": "echo", "models": ["*"]}

# name → (config, extra arguments, words the one line must hold)
MISTAKES: dict[str, tuple[dict | str | None, list[str], list[str]]] = {
    "bad regular expression": (
        {"content_filter": {"input": {"patterns": ["(unclosed"]}}},
        [],
        ["content_filter.input.patterns", "bad regular expression"],
    ),
    "unknown backend kind": (
        {"deployments": [{"name": "x", "backend": "ollama"}]},
        [],
        ["deployments.0.backend", "ollama"],
    ),
    "backend option typo": (
        {
            "deployments": [
                {"name": "x", "backend": "openai-compatible", "options": {"base_urll": "http://h"}}
            ]
        },
        [],
        ["deployments.0", "base_urll"],
    ),
    "backend option typo, with workers": (
        {
            "deployments": [
                {"name": "x", "backend": "openai-compatible", "options": {"base_urll": "http://h"}}
            ]
        },
        ["--workers", "2"],
        ["deployments.0", "base_urll"],
    ),
    "echo takes no options": (
        {"deployments": [{"name": "x", "backend": "echo", "options": {"colour": "red"}}]},
        [],
        ["deployments.0", "colour"],
    ),
    "bad option value": (
        {"deployments": [{"name": "x", "backend": "tgi", "options": {"url": "tgi:80"}}]},
        [],
        ["deployments.0", "url", "http"],
    ),
    "two dialects on one mount": (
        {"mounts": {"openai": "/api", "ovms": "/api/"}},
        [],
        ["mounts", "openai", "ovms", "/api"],
    ),
    "two dialects' operations on one path": (
        {"mounts": {"anthropic": "/"}},  # Anthropic's GET /v1/models beside OpenAI's at /v1
        [],
        ["mounts", "GET /v1/models", "openai", "anthropic"],
    ),
    "unknown key": ({"deployments": [{**ECHO, "colour": "red"}]}, [], ["deployments.0.colour"]),
    "environment variable not set": (
        {"rate_limits": {"store": "redis", "redis": {"url": "${CHATGATE_TEST_UNSET_URL}"}}},
        [],
        ["rate_limits.redis.url", "CHATGATE_TEST_UNSET_URL"],
    ),
    "secret file missing": (
        {"keys": [{"name": "a", "sha256_file": "/nonexistent/key.sha256"}]},
        [],
        ["keys.0", "/nonexistent/key.sha256"],
    ),
    "not YAML": ("deployments: [unclosed", [], ["not valid YAML", "line"]),
    "missing config file": (None, ["--config", "/nonexistent/chatgate.yaml"], ["/nonexistent/chatgate.yaml"]),
    "bad log level": (None, ["--log-level", "verbose"], ["--log-level", "verbose"]),
    "no workers": (None, ["--workers", "0"], ["--workers"]),
}


def write_config(tmp_path: Path, config: dict | str) -> Path:
    path = tmp_path / "chatgate.yaml"
    path.write_text(config if isinstance(config, str) else yaml.safe_dump(config))
    return path


def chatgate(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def assert_one_line(result: subprocess.CompletedProcess, words: list[str]) -> None:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("chatgate: "), lines
    assert "Traceback" not in lines[0]
    for word in words:
        assert word in lines[0], (word, lines[0])


@pytest.mark.parametrize("name", MISTAKES)
def test_serve_stops_with_one_line(tmp_path: Path, name: str):
    config, args, words = MISTAKES[name]
    config_args = ["--config", str(write_config(tmp_path, config))] if config is not None else []
    result = chatgate("serve", "--port", str(free_port()), *config_args, *args)
    assert_one_line(result, words)


@pytest.mark.parametrize("name", [n for n, (config, _, _) in MISTAKES.items() if config is not None])
def test_config_check_says_the_same(tmp_path: Path, name: str):
    config, _, words = MISTAKES[name]
    result = chatgate("config", "check", str(write_config(tmp_path, config)))
    assert_one_line(result, words)


def test_config_check_accepts_a_good_file(tmp_path: Path):
    result = chatgate("config", "check", str(write_config(tmp_path, {"deployments": [ECHO]})))
    assert result.returncode == 0, result.stderr
    assert "ok" in result.stdout


def test_port_in_use(tmp_path: Path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = chatgate("serve", "--port", str(port))
    assert_one_line(result, [f"127.0.0.1:{port}", "in use"])


def test_missing_optional_dependency(tmp_path: Path):
    """The local backend without torch installed: said in one line, with how to install it."""
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text("import sys\nsys.modules['torch'] = None  # as if not installed\n")
    model = tmp_path / "model"
    model.mkdir()
    config = write_config(
        tmp_path, {"deployments": [{"name": "x", "backend": "local", "options": {"path": str(model)}}]}
    )
    result = chatgate(
        "serve", "--port", str(free_port()), "--config", str(config), env={"PYTHONPATH": str(hide)}
    )
    assert_one_line(result, ["deployments.0", "local", "torch", "pip install"])


def test_a_worker_that_cannot_start_stops_the_gateway(tmp_path: Path):
    """A model folder without a model passes the config check and fails in the workers: the
    gateway stops with exit 2 instead of starting them again and again."""
    model = tmp_path / "model"
    model.mkdir()
    config = write_config(
        tmp_path, {"deployments": [{"name": "x", "backend": "local", "options": {"path": str(model)}}]}
    )
    result = chatgate(
        "serve", "--port", str(free_port()), "--config", str(config), "--workers", "2", timeout=120
    )
    assert result.returncode == 2, result.stderr
    reasons = [line for line in result.stderr.splitlines() if line.startswith("chatgate: ")]
    assert reasons and all("deployment 'x'" in line for line in reasons), result.stderr
    assert "Traceback" not in result.stderr


def test_chatgate_config_sets_host_and_port_too(tmp_path: Path):
    """CHATGATE_CONFIG is read like --config: all of it, the server's address included."""
    port = free_port()
    config = write_config(tmp_path, {"server": {"port": port}, "deployments": [ECHO]})
    log = tmp_path / "serve.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve"],
            cwd=ROOT,
            stdout=sink,
            stderr=subprocess.STDOUT,
            env={**os.environ, "CHATGATE_CONFIG": str(config)},
        )
    try:
        wait_until_healthy(f"http://127.0.0.1:{port}", process, log)
        answer = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions", json={"model": "m", "messages": USER}
        )
        assert answer.status_code == 200
    finally:
        process.terminate()
        assert process.wait(10) == 0
