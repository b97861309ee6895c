"""`chatgate conformance` against real OpenAI-compatible servers nobody here wrote (issue 27):
Hugging Face `transformers serve` and llama.cpp's server (llama-cpp-python) serving the tiny
model, and LiteLLM's proxy with a mock model and a master key (tests/support/real_servers.py). Each run
is bounded (--max-examples 1, --max-time), so the suite stays short; the report must show the
deviations these servers really have, and none of the false alarms the command used to raise
(chatgate's own headers, a key check on an open server, a model the server does not serve)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.integration.test_conformance_command import conformance
from tests.support.real_servers import (
    LITELLM_KEY,
    RunningServer,
    cached_gguf,
    litellm_proxy_server,
    llama_server,
    transformers_serve,
)
from tests.support.tiny_model import save_tiny_model

BUDGET = ("--max-examples", "1", "--max-time", "40", "--timeout", "20")
REQUEST_FEATURES = ("n", "logprobs", "tools", "json_object", "json_schema")


def checked(
    server: RunningServer, tmp: Path, *args: str
) -> tuple[subprocess.CompletedProcess, dict[str, Any]]:
    report = tmp / "report.json"
    result = conformance(server.base_url, "--model", server.model, "--report", str(report), *BUDGET, *args)
    assert result.returncode in (0, 1), result.stdout + result.stderr
    return result, json.loads(report.read_text())


def checks_of(report: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(f["check"], f["operation"]): f for f in report["findings"]}


def no_false_alarms(
    result: subprocess.CompletedProcess, report: dict[str, Any], refusals: bool = False
) -> None:
    """`refusals`: the server refuses some schema-valid requests itself (a finding of its own)."""
    for finding in report["findings"]:
        assert "x-request-id" not in finding["example"]["curl"].lower(), finding
        # every valid chat request named the served model: none refused for naming another (the
        # Responses API's operations a server answers its own way, LiteLLM's 400 for an unknown
        # response id where the document says 404, and the stateful runs through them, are the
        # server's own findings; so is LiteLLM's 400 for a parameter its mock provider lacks,
        # `reasoning_effort: "max"`, where a schema-valid request wants an answer or a 422)
        refused = finding["check"] == "positive_data_acceptance"
        if finding["operation"] == "POST /chat/completions" and refused and not refusals:
            assert "UnsupportedParamsError" in finding["example"]["body"], finding
    # the tool never fails (a server's own traceback in an answer it quotes is the server's)
    assert "Traceback" not in result.stderr


@contextmanager
def model_server(kind: str, tmp: Path) -> Iterator[RunningServer]:
    if kind == "transformers":
        with transformers_serve(save_tiny_model(tmp / "model"), tmp) as server:
            yield server
    else:
        with llama_server(cached_gguf("tiny"), tmp) as server:
            yield server


def test_transformers_serve_ignores_the_request_features_and_answers_errors_its_own_way(tmp_path: Path):
    with model_server("transformers", tmp_path) as server:
        result, report = checked(server, tmp_path)
    assert result.returncode == 1
    features = report["features"]
    assert {name: features[name] for name in REQUEST_FEATURES} == dict.fromkeys(REQUEST_FEATURES, "ignored")
    assert features["error_shape"] != "honoured" and features["auth"] == "open"
    bodies = [f["example"]["body"] for f in report["findings"] if f["check"] == "response_schema_conformance"]
    assert any('"detail"' in body for body in bodies), report["findings"]  # FastAPI's {"detail": ...}
    assert all(f["check"] != "ignored_auth" for f in report["findings"])  # an open server
    no_false_alarms(result, report)


def test_llama_cpp_honours_n_and_ignores_tools(tmp_path: Path):
    """llama.cpp's own server (llama-cpp-python's ignored n and honoured tools: the other way round)."""
    with model_server("llama.cpp", tmp_path) as server:
        result, report = checked(server, tmp_path)
    assert result.returncode == 1
    features = report["features"]
    assert (features["n"], features["tools"], features["auth"]) == ("honoured", "ignored", "open")
    # its own refusals of schema-valid requests (an assistant turn with neither content nor
    # tool_calls: 400) are its findings, not false alarms
    no_false_alarms(result, report, refusals=True)
    assert all(f["check"] != "ignored_auth" for f in report["findings"])


def test_litellm_asks_for_a_key_which_never_shows_and_breaks_on_bad_messages(tmp_path: Path):
    with litellm_proxy_server(tmp_path) as server:
        result, report = checked(server, tmp_path, "--key", LITELLM_KEY)
    assert result.returncode == 1
    assert report["features"]["auth"] == "key asked"
    assert report["features"]["error_shape"] == "broken"  # HTTP 500 for messages that are not a list
    assert report["features"]["n"] == "honoured" and report["features"]["tools"] == "ignored"
    assert LITELLM_KEY not in result.stdout + result.stderr + json.dumps(report)
    no_false_alarms(result, report)


def test_the_same_seed_gives_the_same_findings_against_a_real_model(tmp_path: Path):
    """llama.cpp's server on the tiny model answers the same request the same (greedy, or with
    a seed): two runs with one --seed and one case budget (no time budget to cut them anywhere)
    find the same. The fuzzing and stateful phases are the random ones; the others are fixed."""
    runs = []
    with model_server("llama.cpp", tmp_path) as server:
        for run in ("first", "second"):
            report = tmp_path / f"{run}.json"
            result = conformance(
                server.base_url, "--model", server.model, "--report", str(report), "--timeout", "20",
                "--seed", "7", "--max-examples", "20", "--phases", "fuzzing,stateful",
            )  # fmt: skip
            assert result.returncode == 1, result.stdout + result.stderr
            runs.append(json.loads(report.read_text()))
    first, second = runs
    assert first["cases"] == second["cases"] > 0
    assert first["features"] == second["features"]
    assert first["feature_details"] == second["feature_details"]  # the very same answers
    found = [[(f["check"], f["operation"], f["count"], f["status"]) for f in run["findings"]] for run in runs]
    assert found[0] == found[1] and found[0]
