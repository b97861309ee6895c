"""`chatgate probe`: what a server honours is found out, not assumed. Against chatgate's echo
backend (honours everything) and a deviating stand-in (tests/support/deviating_upstream.py), each
feature must end in the verdict the server earns; and a deployment with `probe: true` refuses
with 422 what its upstream ignores, and says so in /ready."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from typer.testing import CliRunner

from gateway.cli import cli
from gateway.policy.auth import new_key
from gateway.probes.sets import PROBE_SETS
from tests.support.deviating_upstream import running_deviating_upstream
from tests.support.gateway_process import gateway_process
from tests.support.servers import ROOT, free_port

pytestmark = pytest.mark.slow  # out of the fast lane (docs/development/tests.md)

ECHO_VERDICTS = {
    "n": "honoured",
    "logprobs": "honoured",
    "tools": "honoured",
    "json_object": "honoured",
    "json_schema": "honoured",
    "stop": "honoured",
    "seed": "honoured",
    "max_tokens": "honoured",
    "stream_done": "honoured",
    "stream_usage": "honoured",
    "error_shape": "honoured",
    "auth": "ignored",  # the default config has no keys: open
}
DEVIATING_VERDICTS = {
    "n": "ignored",
    "logprobs": "ignored",
    "tools": "ignored",
    "json_object": "ignored",
    "json_schema": "ignored",
    "stop": "deviates",  # stopped, but kept in the text: not what the document says
    "seed": "honoured",
    "max_tokens": "honoured",
    "stream_done": "ignored",
    "stream_usage": "ignored",
    "error_shape": "broken",  # a 4xx, but {"detail": ...}
    "auth": "ignored",
}
HI = [{"role": "user", "content": "hi"}]


def probe_process(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "gateway", "probe", *args]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)


def verdicts(report: dict[str, Any]) -> dict[str, str]:
    return {feature: found["verdict"] for feature, found in report["findings"].items()}


def until(check: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := check():
            return found
        time.sleep(0.1)
    raise AssertionError("not within the time allowed")


# ----- the command ----------------------------------------------------------------------------


def test_echo_behind_a_running_gateway_honours_everything(gateway_url: str):
    run = probe_process(f"{gateway_url}/v1", "--model", "echo", "--json")
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert verdicts(report) == ECHO_VERDICTS
    assert report["findings"]["stop"]["detail"].startswith("cut")
    assert report["model"] == "echo" and report["dialect"] == "openai"


MOUNTS = {"openai": "/v1", "azure": "/azure", "aleph_alpha": "/aleph-alpha", "lmi": "/lmi", "ovms": "/v3"}


@pytest.mark.parametrize("dialect", list(MOUNTS))
def test_echo_honours_every_feature_of_every_dialect_probed_in_its_own_shape(gateway_url: str, dialect: str):
    """No --dialect: the mount's served document says which; a feature the dialect does not have
    is not probed, and said so."""
    run = probe_process(f"{gateway_url}{MOUNTS[dialect]}", "--model", "echo", "--json")
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["dialect"] == dialect
    absent = PROBE_SETS[dialect].absent
    assert verdicts(report) == {f: v for f, v in ECHO_VERDICTS.items() if f not in absent}
    assert report["not_probed"] == absent and (dialect == "openai") == (not absent)  # OpenAI has all


# what the stand-in does in each dialect's place, beyond what it does in OpenAI's
DIALECT_DEVIATIONS: dict[str, dict[str, str]] = {
    "lmi": {"stream_done": "broken"},  # its stream is SSE, not LMI's JSON lines
}


@pytest.mark.parametrize("dialect", list(MOUNTS))
def test_a_deviating_server_is_found_out_in_every_dialect(dialect: str):
    with running_deviating_upstream() as upstream:
        run = probe_process(upstream.url_of(dialect), "--model", "m", "--dialect", dialect, "--json")
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    absent = PROBE_SETS[dialect].absent
    expected = {f: v for f, v in DEVIATING_VERDICTS.items() if f not in absent}
    assert verdicts(report) == expected | DIALECT_DEVIATIONS.get(dialect, {})
    assert "detail" in report["findings"]["error_shape"]["detail"]  # {"detail": ...}: no dialect's
    assert report["not_probed"] == absent


def test_a_deviating_server_is_classified_feature_by_feature():
    with running_deviating_upstream() as upstream:
        run = probe_process(upstream.url, "--model", "m", "--json")
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert verdicts(report) == DEVIATING_VERDICTS
    assert report["findings"]["stop"]["detail"].startswith("stopped, but the text keeps the stop string")
    assert "detail" in report["findings"]["error_shape"]["detail"]
    # every probe request carried the model asked for
    assert {body["model"] for body in upstream.bodies} == {"m"}


def test_the_table_for_people_names_each_feature_and_verdict():
    with running_deviating_upstream() as upstream:
        result = CliRunner().invoke(cli, ["probe", upstream.url, "--model", "m"])
    assert result.exit_code == 0, result.output
    rows = {line.split()[0]: line.split()[1] for line in result.output.splitlines()[1:]}
    assert rows == DEVIATING_VERDICTS


def test_a_key_is_sent_and_a_server_that_asks_for_one_is_reported():
    with running_deviating_upstream(key="s3cret") as upstream:
        without = CliRunner().invoke(cli, ["probe", upstream.url, "--model", "m"])
        keyed = ["probe", upstream.url, "--model", "m", "--key", "s3cret", "--json"]
        with_key = CliRunner().invoke(cli, keyed)
    assert without.exit_code == 2
    assert "HTTP 401" in without.output and "--key" in without.output
    assert with_key.exit_code == 0, with_key.output
    found = verdicts(json.loads(with_key.output))
    assert found == {**DEVIATING_VERDICTS, "auth": "honoured"}
    assert "s3cret" not in with_key.output


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--dialect", "klingon"], "one of openai, azure, aleph_alpha, lmi, ovms"),
        (["--header", "no colon"], "is not 'Name: value'"),
        (["--timeout", "0"], "--timeout"),
    ],
)
def test_bad_arguments_are_a_clear_error(args: list[str], said: str):
    result = CliRunner().invoke(cli, ["probe", "http://127.0.0.1:1/v1", "--model", "m", *args])
    assert result.exit_code == 2
    assert said in result.output


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("ftp://example.org/v1", "must begin with http:// or https://"),
        ("http://[bad/v1", "is not a URL to probe"),
        ("http://127.0.0.1:99999/v1", "Port out of range"),
        ("http:///v1", "no host name"),
        ("http://exa mple/v1", "spaces"),
        (f"http://127.0.0.1:{free_port()}/v1", "a plain request to"),
    ],
)
def test_a_server_that_cannot_be_probed_is_exit_2_saying_why(url: str, said: str):
    result = CliRunner().invoke(cli, ["probe", url, "--model", "m", "--timeout", "5"])
    assert result.exit_code == 2
    assert said in result.output
    assert "Traceback" not in result.output


# ----- deployments that probe -------------------------------------------------------------------


def relay(url: str, probe: bool) -> dict[str, Any]:
    options = {"base_url": url, "probe": probe, "probe_timeout": 10}
    return {"deployments": [{"name": "dev", "backend": "openai-compatible", "options": options}]}


def probed(gateway: str) -> dict[str, Any] | None:
    found = httpx.get(f"{gateway}/ready").json().get("probes", {}).get("dev")
    return found if found and found["state"] == "done" else None


def ask(gateway: str, **parameters: Any) -> httpx.Response:
    body = {"model": "dev", "messages": HI, **parameters}
    return httpx.post(f"{gateway}/v1/chat/completions", json=body, timeout=30)


NOT_HONOURED_REQUESTS = [
    ("n", {"n": 2}),
    ("logprobs", {"logprobs": True, "top_logprobs": 2}),
    ("tools", {"tools": [{"type": "function", "function": {"name": "f"}}]}),
    ("response_format", {"response_format": {"type": "json_object"}}),
    ("response_format", {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}),
]


def test_a_probing_deployment_refuses_what_its_upstream_ignores(tmp_path: Path):
    with (
        running_deviating_upstream() as upstream,
        gateway_process(tmp_path, relay(upstream.url, True)) as gateway,
    ):
        found = until(lambda: probed(gateway.url))
        for param, parameters in NOT_HONOURED_REQUESTS:
            refused = ask(gateway.url, **parameters)
            assert refused.status_code == 422, (parameters, refused.text)
            assert refused.json()["error"]["param"] == param
            assert "not support" in refused.json()["error"]["message"]
        # what it honours still passes: a plain request, stop (kept), seed
        for parameters in ({}, {"stop": ["x"]}, {"seed": 3}):
            assert ask(gateway.url, **parameters).status_code == 200, parameters
    assert found["narrowed"] == ["json_object", "json_schema", "logprobs", "n", "tools"]
    assert found["replicas"]["dev-0"]["findings"] == DEVIATING_VERDICTS
    assert "response_format json_object" in found["refused"]


def test_a_reload_that_turns_probing_on_narrows_the_deployment(tmp_path: Path):
    with (
        running_deviating_upstream() as upstream,
        gateway_process(tmp_path, relay(upstream.url, False)) as gateway,
    ):
        # unprobed, the upstream's silent drop passes as a 200: no logprobs in it
        unprobed = ask(gateway.url, logprobs=True)
        assert unprobed.status_code == 200
        assert unprobed.json()["choices"][0].get("logprobs") is None
        assert "probes" not in httpx.get(f"{gateway.url}/ready").json()
        config = next(tmp_path.glob("chatgate-*.yaml"))
        config.write_text(yaml.safe_dump(relay(upstream.url, probe=True)))
        gateway.signal(signal.SIGHUP)
        until(lambda: probed(gateway.url))
        assert ask(gateway.url, logprobs=True).status_code == 422


def test_an_upstream_that_is_down_delays_nothing_and_is_probed_once_it_is_up(tmp_path: Path):
    port = free_port()
    config = relay(f"http://127.0.0.1:{port}/v1", probe=True)
    with gateway_process(tmp_path, config) as gateway:  # healthy at once: probing waits for nothing
        failed = until(lambda: httpx.get(f"{gateway.url}/ready").json()["probes"]["dev"]["state"] == "failed")
        assert failed
        ready = httpx.get(f"{gateway.url}/ready")
        assert ready.status_code == 200
        assert "a plain request" in ready.json()["probes"]["dev"]["replicas"]["dev-0"]["error"]
        # until probed, the capabilities are as declared: n=2 goes upstream (and fails there)
        assert ask(gateway.url, n=2).status_code != 422
        with running_deviating_upstream(port=port):
            until(lambda: probed(gateway.url), timeout=60)
            assert ask(gateway.url, n=2).status_code == 422


def test_ready_names_nothing_of_an_upstream_without_a_key_and_never_its_words(tmp_path: Path):
    """On a gateway with keys, /ready without one says the status alone; with one, why a
    deployment was not probed in the gateway's words (the HTTP status), never the upstream's
    text, which may quote the gateway's own upstream key; the log redacts that key too."""
    key, sha = new_key()
    secret = "sk-upstream-secret-4711"
    with running_deviating_upstream(key="the-right-one") as upstream:
        config = relay(upstream.url, probe=True)
        config["deployments"][0]["options"]["api_key"] = secret
        config["keys"] = [{"name": "ops", "sha256": sha}]
        with gateway_process(tmp_path, config) as gateway:
            with_key = {"Authorization": f"Bearer {key}"}

            def failed() -> dict[str, Any] | None:
                found = httpx.get(f"{gateway.url}/ready", headers=with_key).json()["probes"]["dev"]
                return found if found["state"] == "failed" else None

            found = until(failed)
            anonymous = httpx.get(f"{gateway.url}/ready")
            assert anonymous.status_code == 200
            assert anonymous.json() == {"status": "ready"}
            wrong = httpx.get(f"{gateway.url}/ready", headers={"Authorization": "Bearer nope"})
            assert wrong.json() == {"status": "ready"}
            said = found["replicas"]["dev-0"]["error"]
            assert said == "the upstream answered a plain request with HTTP 401"
            shown = httpx.get(f"{gateway.url}/ready", headers=with_key).text
            assert secret not in shown and "127.0.0.1" not in shown and "Incorrect" not in shown
            log = gateway.output()
            assert "Incorrect API key provided: <redacted>" in log  # the words are for the log ...
            assert secret not in log  # ... never the key they quote
