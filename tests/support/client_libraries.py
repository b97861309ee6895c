"""Today's client libraries for tests/system/test_clients_today.py, installed once under ~/.cache.

- LangChain's ChatOpenAI and llama-index's OpenAILike in a venv of their own (they bring their
  own openai, pydantic and some eighty packages, none of which may move chatgate's), every
  package pinned by tests/support/clients/python-clients.txt;
- the agent-era Python clients, the OpenAI Agents SDK and LangChain's ChatAnthropic, in another
  (their openai and langchain-core differ from the first's), pinned by python-agents.txt;
- openai for Node, the Vercel AI SDK, @anthropic-ai/sdk, Claude Code and Codex CLI (both carry
  their native binary in a registry package) in an npm folder, installed by `npm ci` from
  tests/support/clients/package-lock.json;
- litellm 1.80.0 as a client: the venv the benchmark makes (bench/litellm_proxy);
- client generators: openapi-generator (its PyPI package, with the jar; Java 17) in a venv of
  its own, pinned by python-generators.txt, and openapi-typescript with openapi-fetch and
  TypeScript in the npm folder.

`python -m tests.support.real_servers` makes them (scripts/run-tests runs it); seconds once made.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from tests.support.real_servers import CACHE, INSTALL_HINT, ServerVenv

CLIENTS = Path(__file__).with_name("clients")


def pinned(lock: str) -> tuple[str, ...]:
    """A venv's lock in tests/support/clients: one `name==version` a line."""
    lines = (CLIENTS / lock).read_text().splitlines()
    return tuple(line for line in lines if line and not line.startswith("#"))


PINNED = pinned("python-clients.txt")
PYTHON_CLIENTS = ServerVenv("clients-langchain-openai-1.7.4-llama-index-0.8.1", PINNED)
AGENTS_PINNED = pinned("python-agents.txt")
AGENT_CLIENTS = ServerVenv("clients-openai-agents-0.24.0-langchain-anthropic-1.7.10", AGENTS_PINNED)
GENERATORS_PINNED = pinned("python-generators.txt")
GENERATORS = ServerVenv("generators-openapi-generator-cli-7.26.0", GENERATORS_PINNED)
NODE_CLIENTS = CACHE / "clients-node"
NODE_STAMP = "chatgate-tests-installed"  # written once `npm ci` has finished: the lock it installed


def node_lock_text() -> str:
    return (CLIENTS / "package.json").read_text() + (CLIENTS / "package-lock.json").read_text()


def node_ready() -> bool:
    stamp = NODE_CLIENTS / NODE_STAMP
    return stamp.exists() and stamp.read_text() == node_lock_text()


def install_node(say: Callable[[str], None]) -> None:
    if node_ready():
        return
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm is not installed: ./scripts/run-tests installs it")
    say(f"clients: making {NODE_CLIENTS}: npm ci ({', '.join(node_dependencies())})")
    shutil.rmtree(NODE_CLIENTS, ignore_errors=True)
    NODE_CLIENTS.mkdir(parents=True)
    for name in ("package.json", "package-lock.json"):
        shutil.copy(CLIENTS / name, NODE_CLIENTS / name)
    subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=NODE_CLIENTS, check=True)
    (NODE_CLIENTS / NODE_STAMP).write_text(node_lock_text())


def node_dependencies() -> list[str]:
    dependencies = json.loads((CLIENTS / "package.json").read_text())["dependencies"]
    return [f"{name}@{version}" for name, version in dependencies.items()]


def node_folder() -> Path:
    """The npm folder, or a failed test naming the command that makes it."""
    assert node_ready(), f"{NODE_CLIENTS} is not installed: {INSTALL_HINT}"
    return NODE_CLIENTS


def install_all(say: Callable[[str], None] = print) -> None:
    PYTHON_CLIENTS.install(say)
    AGENT_CLIENTS.install(say)
    GENERATORS.install(say)
    install_node(say)


def node_environment() -> dict[str, str]:
    return {**os.environ, "NODE_PATH": str(NODE_CLIENTS / "node_modules")}
