"""The bundled TGI GPU stack (deploy/): checked as files, since tests run without Docker.

The compose file must parse, run the official TGI image at a pinned 3.x tag on a reserved
NVIDIA GPU, and mount a gateway config whose `tgi` deployment points at the compose service.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from backends.tgi.backend import TGIBackend
from gateway.config.source import load_settings

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
COMPOSE = DEPLOY / "compose.tgi.yaml"
TGI_IMAGE = re.compile(r"^ghcr\.io/huggingface/text-generation-inference:3\.\d+\.\d+$")
WITH_DEFAULT = re.compile(r"^\$\{(\w+):-([^}]+)\}$")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, Any]:
    return compose["services"]


def default_of(value: str) -> str:
    """The value Compose uses for `${NAME:-default}` when NAME is unset."""
    match = WITH_DEFAULT.match(str(value))
    assert match, f"{value!r} is not ${{NAME:-default}}"
    return match.group(2)


def mounted_config(services: dict[str, Any]) -> Path:
    """The host file mounted where the chatgate service's `--config` points."""
    command = services["chatgate"]["command"]
    command = shlex.split(command) if isinstance(command, str) else command
    target = command[command.index("--config") + 1]
    for volume in services["chatgate"]["volumes"]:
        source, _, rest = volume.partition(":")
        if rest.split(":")[0] == target:
            return (COMPOSE.parent / source).resolve()
    raise AssertionError(f"nothing is mounted at {target}")


def test_tgi_runs_the_official_image_pinned_to_a_3x_release(services):
    assert {"tgi", "redis", "chatgate"} <= set(services)
    assert TGI_IMAGE.match(services["tgi"]["image"]), services["tgi"]["image"]


def test_tgi_reserves_an_nvidia_gpu(services):
    devices = services["tgi"]["deploy"]["resources"]["reservations"]["devices"]
    assert any(d["driver"] == "nvidia" and "gpu" in d["capabilities"] for d in devices)
    assert services["tgi"]["shm_size"]


def test_tgi_model_limits_weights_and_health(services):
    tgi = services["tgi"]
    environment = tgi["environment"]
    assert default_of(environment["MODEL_ID"])  # a variable, with a small default
    for limit in (
        "MAX_INPUT_TOKENS",
        "MAX_TOTAL_TOKENS",
        "MAX_BATCH_PREFILL_TOKENS",
        "MAX_CONCURRENT_REQUESTS",
    ):
        assert int(default_of(environment[limit])) > 0, limit
    assert int(default_of(environment["MAX_INPUT_TOKENS"])) < int(default_of(environment["MAX_TOTAL_TOKENS"]))
    assert "HF_TOKEN" in environment and environment["HF_TOKEN"] is None  # passed through when set
    assert any(str(v).endswith(":/data") for v in tgi["volumes"])
    assert "/health" in " ".join(tgi["healthcheck"]["test"])


def test_gateway_waits_for_healthy_tgi_and_redis(services):
    chatgate = services["chatgate"]
    assert chatgate["build"]["dockerfile"] == "deploy/Dockerfile"
    assert (COMPOSE.parent / chatgate["build"]["context"] / chatgate["build"]["dockerfile"]).is_file()
    assert chatgate["depends_on"]["tgi"]["condition"] == "service_healthy"
    assert chatgate["depends_on"]["redis"]["condition"] == "service_healthy"
    assert "redis-cli" in services["redis"]["healthcheck"]["test"]


def test_the_mounted_gateway_config_points_tgi_at_the_compose_service(services):
    settings = load_settings(mounted_config(services))
    [deployment] = [d for d in settings.deployments if d.backend == "tgi"]
    url = urlsplit(deployment.options["url"])
    assert url.hostname == "tgi" and url.hostname in services
    assert url.port == 80  # TGI's port inside its image (PORT=80), where its healthcheck looks
    backend = TGIBackend(model=deployment.served_model, **deployment.options)  # the options validate
    environment = services["tgi"]["environment"]
    assert backend.options.max_stop_sequences == int(environment["MAX_STOP_SEQUENCES"])
    assert backend.options.max_top_n_tokens == int(environment["MAX_TOP_N_TOKENS"])
    assert backend.options.context_length == int(default_of(environment["MAX_TOTAL_TOKENS"]))
    assert settings.rate_limits.store == "redis"
    assert urlsplit(settings.rate_limits.redis.url).hostname == "redis"
    assert settings.server.host == "0.0.0.0"


def test_the_gateway_stops_within_its_grace_period(services):
    # Compose's default is 10 s before SIGKILL; the gateway drains and finishes streams first.
    grace = services["chatgate"]["stop_grace_period"]
    assert re.fullmatch(r"\d+s", grace) and int(grace[:-1]) >= 35, grace


def test_the_readme_section_gives_the_one_command():
    readme = (DEPLOY / "README.md").read_text(encoding="utf-8")
    assert "## Serve a model on a GPU with TGI" in readme
    assert "docker compose -f deploy/compose.tgi.yaml up -d --build" in readme
