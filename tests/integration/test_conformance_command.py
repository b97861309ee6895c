"""`chatgate conformance URL`, run as a user runs it: clean against a live chatgate (exit 0),
failing with the failure named against a deliberately broken endpoint (exit 1). The checks
against the vendors' own documents are skipped when there are none (tests/conftest.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from gateway.policy.auth import new_key
from gateway.probes.sets import PROBE_SETS
from gateway.tools.conformance import Report, render
from gateway.tools.conformance_report import Feature, html_page, junit
from gateway.tools.vendor_specs import VENDOR_DOCUMENTS
from tests.support.broken_endpoint import broken_endpoint
from tests.support.servers import ROOT, running_gateway

pytestmark = pytest.mark.slow  # out of the fast lane (docs/development/tests.md)

KEY, KEY_SHA = new_key()


def conformance(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gateway", "conformance", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})},
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


CLEAN = {"openai": "/v1", "aleph_alpha": "/aleph-alpha"}  # dialect → its mount


def vendor_line(report: str) -> str:
    return next(line for line in report.splitlines() if "vendor document:" in line)


def with_refspecs(refspecs_dir: Path | None) -> tuple[str, ...]:
    """Point the command at the folder the tests found (it would find the same one by itself)."""
    return ("--refspecs", str(refspecs_dir)) if refspecs_dir is not None else ()


@pytest.fixture(scope="module")
def clean_runs(chatgate: str, refspecs_dir: Path | None) -> dict[str, subprocess.CompletedProcess]:
    """One run per dialect against the live chatgate, with the vendor documents when found."""
    common = ("--max-examples", "10", "--key", KEY, *with_refspecs(refspecs_dir))
    return {
        dialect: conformance(chatgate + mount, "--dialect", dialect, *common)
        for dialect, mount in CLEAN.items()
    }


@pytest.fixture(scope="module")
def broken_run(refspecs_dir: Path | None) -> subprocess.CompletedProcess:
    with broken_endpoint() as url:
        return conformance(url, "--dialect", "openai", "--max-examples", "5", *with_refspecs(refspecs_dir))


@pytest.mark.parametrize("dialect", list(CLEAN))
def test_clean_against_a_live_chatgate(clean_runs: dict[str, subprocess.CompletedProcess], dialect: str):
    result = clean_runs[dialect]
    assert result.returncode == 0, result.stdout + result.stderr
    assert "result: conformant" in result.stdout
    assert "POST /chat/completions" in result.stdout
    if dialect == "openai":  # the Responses API's operations, under the same mount
        assert (
            "POST /responses  " in result.stdout
            and "GET /responses/{response_id}/input_items" in result.stdout
        )


@pytest.mark.parametrize("dialect", list(CLEAN))
def test_clean_run_checked_the_vendor_document(
    clean_runs: dict[str, subprocess.CompletedProcess], dialect: str, refspecs: Path
):
    assert vendor_line(clean_runs[dialect].stdout).endswith(VENDOR_DOCUMENTS[dialect].file)


def test_fails_against_a_broken_endpoint_and_names_the_failure(broken_run: subprocess.CompletedProcess):
    assert broken_run.returncode == 1, broken_run.stdout + broken_run.stderr
    report = broken_run.stdout
    assert "result: NOT conformant" in report
    chat = operation_block(report, "POST /chat/completions")
    assert "FAILED response_schema_conformance" in chat  # our document
    assert "curl -X POST" in chat
    assert "response_schema_conformance on POST /chat/completions" in report.splitlines()[-1]


def test_the_vendor_document_names_a_broken_endpoints_failure(
    broken_run: subprocess.CompletedProcess, refspecs: Path
):
    chat = operation_block(broken_run.stdout, "POST /chat/completions")
    assert "FAILED vendor_spec_conformance" in chat  # OpenAI's own document


def test_without_vendor_documents_the_report_says_how_to_get_them():
    report = Report("openai", "http://x/v1", "openapi/openai.yaml", vendor_file=None, max_examples=1)
    line = vendor_line(render(report))
    assert "not found, so not checked" in line
    assert "scripts/fetch-refspecs" in line and "CHATGATE_REFSPECS" in line


def test_a_refspecs_folder_that_is_not_there_is_a_clear_error(chatgate: str, tmp_path: Path):
    missing = tmp_path / "no-such-folder"
    result = conformance(chatgate + "/v1", "--max-examples", "1", "--refspecs", str(missing))
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"{missing} is not a folder" in result.stderr
    result = conformance(chatgate + "/v1", "--max-examples", "1", env={"CHATGATE_REFSPECS": str(missing)})
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"CHATGATE_REFSPECS={missing} is not a folder" in result.stderr


def test_unreachable_endpoint_is_a_clear_error():
    with broken_endpoint() as url:
        pass  # closed again: nothing listens there now
    result = conformance(url, "--max-examples", "1")
    assert result.returncode == 2
    assert "cannot reach" in result.stderr


@pytest.mark.parametrize("dialect, mount", [("azure", "/azure"), ("lmi", "/lmi")])
def test_undefined_fields_mode_finds_no_server_error(chatgate: str, dialect: str, mount: str):
    """--extra-fields pass-through keeps what schemathesis generates beyond the document (the class
    of input that gave 500s) and sends it; a fixed --seed makes the run repeatable."""
    args = ["--dialect", dialect, "--max-examples", "15", "--key", KEY, "--extra-fields", "pass-through"]
    first = conformance(chatgate + mount, *args, "--seed", "4242")
    assert "not_a_server_error" not in first.stdout, first.stdout
    assert "Server error" not in first.stdout, first.stdout
    again = conformance(chatgate + mount, *args, "--seed", "4242")
    cases = [line for line in first.stdout.splitlines() if " cases " in line]
    assert cases and cases == [line for line in again.stdout.splitlines() if " cases " in line]


ALL_MOUNTS = {"openai": "/v1", "azure": "/azure", "aleph_alpha": "/aleph-alpha", "lmi": "/lmi", "ovms": "/v3"}


@pytest.mark.parametrize("dialect", list(ALL_MOUNTS))
def test_the_readme_command_against_the_default_open_gateway_is_conformant(
    gateway_url: str, refspecs_dir: Path | None, dialect: str, tmp_path: Path
):
    """No keys configured: the served document declares no security, so ignored_auth has nothing
    to hold the gateway to, and no key is needed. No --dialect: the served document says which,
    and the dialect's own probes run (every feature it has honoured, the others named)."""
    report = tmp_path / "report.json"
    result = conformance(
        gateway_url + ALL_MOUNTS[dialect], "--model", "echo", "--max-examples", "3",
        "--report", str(report), *with_refspecs(refspecs_dir),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "result: conformant" in result.stdout
    assert f"chatgate conformance: {dialect} dialect at" in result.stdout
    assert "auth: none declared by the endpoint's own document" in result.stdout
    found = json.loads(report.read_text())
    absent = PROBE_SETS[dialect].absent
    assert found["features"] == {
        p.feature: "open" if p.feature == "auth" else "honoured" for p in PROBE_SETS[dialect].probes
    }
    assert found["not_probed"] == absent
    for feature in absent:
        assert re.search(rf"^  {feature} +n/a +not probed: ", result.stdout, re.MULTILINE), result.stdout


EVERY_MOUNT = {**ALL_MOUNTS, "anthropic": "/anthropic"}
# the model each mount's own listing names (OVMS's document has none, and needs one named; LMI's
# has none, and needs none)
LISTED = {"openai": "echo", "azure": "echo", "aleph_alpha": "echo", "anthropic": "echo", "lmi": None}


@pytest.mark.parametrize("dialect", list(EVERY_MOUNT))
def test_without_model_every_feature_is_probed_or_the_run_says_plainly_it_was_not(
    gateway_url: str, dialect: str, tmp_path: Path
):
    """The echo gateway's default config, no --model: the model is found through the dialect's own
    listing (/models, /models_available, /info, /v1/models) and every feature of the dialect is
    probed; where the document lists none and needs one named (OVMS), the run says so and is not
    conformant, in the terminal, the JSON, the page and the exit code."""
    report, page = tmp_path / "report.json", tmp_path / "report.html"
    result = conformance(
        gateway_url + EVERY_MOUNT[dialect], "--max-examples", "1", "--phases", "examples",
        "--report", str(report), "--html", str(page),
    )  # fmt: skip
    found, verdict = json.loads(report.read_text()), result.stdout.splitlines()[-1]
    if dialect not in LISTED:
        assert result.returncode == 1, result.stdout + result.stderr
        assert verdict.startswith(
            f"result: NOT conformant — the features were not probed because the {dialect} document "
            "lists no models, and its chat requests must name one: pass --model NAME"
        ), verdict
        assert found["conformant"] is False and found["features"] == {} and found["not_tested"]
        assert verdict in page.read_text() and "every feature honoured" not in page.read_text()
        return
    assert result.returncode == 0, result.stdout + result.stderr
    assert found["model"] == LISTED[dialect] and found["not_tested"] is None
    assert found["features"] == {
        p.feature: "open" if p.feature == "auth" else "honoured" for p in PROBE_SETS[dialect].probes
    }
    assert "(model None)" not in result.stderr and "probing the features (" in result.stderr


def test_a_listing_refused_for_a_key_is_named_as_the_cause(chatgate: str):
    """A keyed gateway's listing answers 401: the run says a key is needed (or was refused), not
    that the server lists no model."""
    args = ("--max-examples", "1", "--phases", "examples")
    keyless = conformance(chatgate + "/azure", *args)
    assert keyless.returncode == 1
    assert "GET /info answered HTTP 401: a key is needed: pass --key KEY" in keyless.stdout
    refused = conformance(chatgate + "/aleph-alpha", *args, "--key", "cg-not-a-key")
    assert refused.returncode == 1
    assert "GET /models_available answered HTTP 401: the key was refused" in refused.stdout
    assert "lists none" not in keyless.stdout + refused.stdout
    keyed = conformance(chatgate + "/azure", *args, "--key", KEY)
    assert "model: echo (named by GET /info)" in keyed.stdout, keyed.stdout
    # the key check's own keyless requests are answered 401 by design: not a key refused
    assert keyed.returncode == 0 and keyed.stdout.splitlines()[-1].startswith("result: conformant")


def test_a_gateway_with_keys_but_no_key_given_is_not_read_as_conformant(
    chatgate: str, refspecs_dir: Path | None
):
    """Nearly every answer is a 401, on which no schema check has anything to say: the run tested
    the key check only, and says so."""
    args = ("--dialect", "aleph_alpha", "--max-examples", "5", *with_refspecs(refspecs_dir))
    result = conformance(chatgate + "/aleph-alpha", *args)
    assert result.returncode == 1, result.stdout + result.stderr
    verdict = result.stdout.splitlines()[-1]
    assert verdict.startswith("result: NOT conformant — not tested:")
    assert "401 Unauthorized (the endpoint needs a key: pass --key KEY)" in verdict
    refused = conformance(chatgate + "/aleph-alpha", *args, "--key", "cg-not-a-key")
    assert refused.returncode == 1
    assert "(the key was refused)" in refused.stdout.splitlines()[-1]


def test_a_locked_out_run_is_not_clean():
    report = Report("openai", "http://x/v1", "openapi/openai.yaml", vendor_file=None, max_examples=1)
    result = report.operation("POST /chat/completions")
    result.cases, result.answers, result.unauthorized = 10, 10, 6
    assert not report.clean and report.locked_out
    result.unauthorized = 2  # the probes of the key check, among real answers
    assert report.clean


def test_a_run_that_probed_nothing_is_never_read_as_conformant():
    """No failure, but the features were not probed, or no case was sent: not conformant, and
    the verdict says why, in the terminal, the JSON and the page."""
    report = Report("ovms", "http://x/v3", "openapi/ovms.yaml", vendor_file=None, max_examples=1)
    report.operation("POST /chat/completions").cases = 3
    report.not_tested = "the ovms document lists no models, and its chat requests must name one"
    verdict = render(report).splitlines()[-1]
    assert verdict.startswith("result: NOT conformant — the features were not probed because the ovms")
    assert "every feature honoured" not in render(report) + html_page(report)
    assert report.as_json()["conformant"] is False and report.as_json()["not_tested"]
    suite = ET.fromstring(junit(report))
    assert suite.get("failures") == "1" and suite.find("testcase[@name='tested']/failure") is not None
    report.operation("POST /chat/completions").cases = 0
    assert render(report).splitlines()[-1] == (
        "result: NOT conformant — nothing was probed because the ovms document lists no models, "
        "and its chat requests must name one"
    )
    report.not_tested = ""
    report.features = [Feature("n", "honoured")]
    assert "no case was sent" in render(report).splitlines()[-1] and not report.clean


def test_stream_payloads_are_cut_only_where_sse_ends_a_line():
    """JSON carries U+2028, U+2029 and U+0085 unescaped; the vendor check read them as line ends
    and called a whole answer broken (found by the 10,000-case fuzz, on echo repeating them)."""
    from gateway.tools.vendor_specs import stream_payloads

    said = "a\u2028b\u2029c\u0085d\x1ce"
    wire = f'data: {{"content":"{said}"}}\r\n\r\ndata: [DONE]\n\n'.encode()
    assert stream_payloads(wire) == [f'{{"content":"{said}"}}', "[DONE]"]
    assert stream_payloads(wire + b'data: {"cut', complete=False) == [f'{{"content":"{said}"}}', "[DONE]"]
