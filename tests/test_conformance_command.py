"""`chatgate conformance URL`, run as a user runs it: clean against a live chatgate (exit 0),
failing with the failure named against a deliberately broken endpoint (exit 1)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from gateway.policy.auth import new_key
from tests.broken_endpoint import broken_endpoint
from tests.servers import ROOT, running_gateway

KEY, KEY_SHA = new_key()


def conformance(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gateway", "conformance", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ},
    )  # fmt: skip


def operation_block(report: str, label: str) -> str:
    """The report's lines for one operation: its summary line and the indented lines under it."""
    lines = report.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"  {label} "))
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].startswith("    ")), len(lines))
    return "\n".join(lines[start:end])


@pytest.fixture(scope="module")
def chatgate(tmp_path_factory: pytest.TempPathFactory, log_dir: Path) -> Iterator[str]:
    """A gateway with a key configured, so that the auth checks have something to check."""
    config = tmp_path_factory.mktemp("conformance") / "config.yaml"
    config.write_text(yaml.safe_dump({"keys": [{"name": "conformance", "sha256": KEY_SHA}]}))
    with running_gateway(log_dir, config) as url:
        yield url


@pytest.mark.parametrize("dialect, mount", [("openai", "/v1"), ("aleph_alpha", "/aleph-alpha")])
def test_clean_against_a_live_chatgate(chatgate: str, dialect: str, mount: str):
    result = conformance(chatgate + mount, "--dialect", dialect, "--max-examples", "10", "--key", KEY)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "result: conformant" in result.stdout
    assert "POST /chat/completions" in result.stdout
    assert "vendor document: none" not in result.stdout


def test_fails_against_a_broken_endpoint_and_names_the_failure():
    with broken_endpoint() as url:
        result = conformance(url, "--dialect", "openai", "--max-examples", "5")
    assert result.returncode == 1, result.stdout + result.stderr
    report = result.stdout
    assert "result: NOT conformant" in report
    chat = operation_block(report, "POST /chat/completions")
    assert "FAILED response_schema_conformance" in chat  # our document
    assert "FAILED vendor_spec_conformance" in chat  # OpenAI's own document
    assert "curl -X POST" in chat
    assert "response_schema_conformance on POST /chat/completions" in report.splitlines()[-1]


def test_unreachable_endpoint_is_a_clear_error():
    with broken_endpoint() as url:
        pass  # closed again: nothing listens there now
    result = conformance(url, "--max-examples", "1")
    assert result.returncode == 2
    assert "cannot reach" in result.stderr
