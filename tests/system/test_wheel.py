"""The wheel is what users install: built with `python -m build`, installed into a fresh venv
outside the repository, it serves every dialect from any directory."""

from __future__ import annotations

import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway.dialects.registry import DIALECTS
from tests.support.dialect_routes import main_routes
from tests.support.readers import reader
from tests.support.servers import AZURE_API_VERSION, CHAT_PATHS, ROOT, free_port, wait_until_healthy

DOCUMENTS = {dialect.document for dialect in DIALECTS.values()}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dist = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    [built] = dist.glob("chatgate-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment (no system packages, nothing of the checkout) with the wheel."""
    place = tmp_path_factory.mktemp("venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(place)], check=True, timeout=120)
    subprocess.run(
        [
            str(place / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            str(wheel),
        ],
        check=True,
        capture_output=True,
        timeout=900,
    )
    return place


@pytest.fixture(scope="module")
def served(venv: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`chatgate serve` from the venv, started in an empty folder far from the repository."""
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    port = free_port()
    log = elsewhere / "serve.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [str(venv / "bin" / "chatgate"), "serve", "--port", str(port)],
            cwd=elsewhere,
            stdout=sink,
            stderr=subprocess.STDOUT,
            env={"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(elsewhere)},
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, process, log, timeout=60)
        yield url
    finally:
        process.terminate()
        process.wait(20)


def test_the_wheel_holds_the_packages_and_documents(wheel: Path):
    names = zipfile.ZipFile(wheel).namelist()
    assert {f"gateway/openapi/{name}" for name in DOCUMENTS} <= set(names)
    for package in ("gateway/policy/", "gateway/dialects/", "backends/", "generated/"):
        assert any(n.startswith(package) for n in names), package
    assert not [n for n in names if n.startswith(("tests/", "bench/"))]


def test_the_installed_gateway_comes_from_the_venv(venv: Path, tmp_path: Path):
    where = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "from gateway.http import documents; import gateway; print(gateway.__file__, documents.SPEC_DIR)",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert str(venv) in where and str(ROOT) not in where, where


@pytest.mark.parametrize("dialect", CHAT_PATHS)
def test_every_dialect_answers_from_the_wheel(served: str, dialect: str):
    body = main_routes()[dialect].body("Hello from the wheel!")
    answer = httpx.post(f"{served}{CHAT_PATHS[dialect]}", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    assert "Hello from the wheel!" in reader(dialect).text(answer.json())


def test_documents_and_swagger_ui_are_served(served: str):
    document = httpx.get(f"{served}/v1/openapi.json", timeout=10)
    assert document.status_code == 200 and document.json()["paths"]
    info = httpx.get(f"{served}/azure/info", params={"api-version": AZURE_API_VERSION}, timeout=10)
    assert info.status_code == 200, info.text
    ui = httpx.get(f"{served}/v1/ui/", timeout=10)
    assert ui.status_code == 200 and "swagger" in ui.text.lower()
    started = time.monotonic()
    asset = httpx.get(f"{served}/v1/ui/swagger-ui-bundle.js", timeout=10)
    assert asset.status_code == 200 and len(asset.content) > 100_000, time.monotonic() - started


def test_config_check_runs_from_the_wheel(venv: Path, tmp_path: Path):
    config = tmp_path / "chatgate.yaml"
    config.write_text("deployments:\n  - {name: echo, backend: echo, models: ['*']}\n")
    result = subprocess.run(
        [str(venv / "bin" / "chatgate"), "config", "check", str(config)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
