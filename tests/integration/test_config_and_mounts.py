"""Configuration fails loudly at start; mounts are configurable (any dialect can sit at /)."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from gateway.config.settings import ConfigError
from gateway.config.source import load_settings
from tests.support.servers import ROOT, running_gateway


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("deployments:\n  - name: a\n    backend: echo\n    colour: blue\n", "deployments.0.colour"),
        ("deployments:\n  - name: a\n    backend: nosuch\n", "deployments.0.backend"),
        ("server:\n  port: 99999\n", "server.port"),
        ("mountz:\n  openai: /x\n", "mountz"),
        ("deployments:\n  - {name: a}\n  - {name: a}\n", "unique"),
        ("deployments: []\n", "deployments"),
    ],
)
def test_invalid_config_names_the_bad_key(tmp_path, text: str, named: str):
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        load_settings(path)


def test_serve_refuses_a_bad_config(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("deployments:\n  - name: a\n    backend: echo\n    colour: blue\n")
    result = subprocess.run(
        [sys.executable, "-m", "gateway", "serve", "--config", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "deployments.0.colour" in result.stderr
    assert "Traceback" not in result.stderr


def test_lmi_at_the_root_like_a_sagemaker_container(tmp_path, log_dir):
    config = tmp_path / "config.yaml"
    config.write_text("mounts:\n  lmi: /\n  openai: /openai\n")
    with running_gateway(log_dir, config) as url:
        assert httpx.get(f"{url}/ping").json() == {"status": "Healthy"}
        response = httpx.post(f"{url}/invocations", json={"messages": [{"role": "user", "content": "hi"}]})
        assert response.json()["choices"][0]["finish_reason"] == "eos_token"
        assert httpx.get(f"{url}/openai/models").json()["object"] == "list"
        assert httpx.get(f"{url}/v1/models").status_code == 404
        assert httpx.get(f"{url}/health").status_code == 200


def test_azure_at_the_root_and_a_dialect_unmounted(tmp_path, log_dir):
    config = tmp_path / "config.yaml"
    config.write_text("mounts:\n  azure: ''\n  ovms: null\n")
    with running_gateway(log_dir, config) as url:
        info = httpx.get(f"{url}/info", params={"api-version": "2024-05-01-preview"})
        assert info.json()["model_type"] == "chat_completion"
        assert httpx.post(f"{url}/v3/chat/completions", json={}).status_code == 404


def test_specs_are_served_and_browsable(gateway_url: str):
    for mount in ("/v1", "/azure", "/aleph-alpha", "/lmi", "/v3"):
        spec = httpx.get(f"{gateway_url}{mount}/openapi.json")
        assert spec.status_code == 200 and spec.json()["openapi"] == "3.0.3"
        ui = httpx.get(f"{gateway_url}{mount}/ui/", follow_redirects=True)
        assert ui.status_code == 200 and "swagger" in ui.text.lower()
