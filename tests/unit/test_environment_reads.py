"""The environment is read once, where the settings are loaded (gateway/config/environment.py says what
is taken); the code below takes it from `Settings.environment`. This walks every module of
`gateway/` and `backends/` for a read of `os.environ` or `os.getenv` outside the few allowed."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from gateway.config.settings import Settings
from gateway.config.source import load_settings

ROOT = Path(__file__).resolve().parents[2]
ALLOWED = {
    "gateway/config/settings.py": "the settings' own snapshot, when they are made without the loader",
    "gateway/config/source.py": "the settings loader: ${VAR} references, CHATGATE_CONFIG, the snapshot",
    "gateway/server/serving.py": "sets PROMETHEUS_MULTIPROC_DIR for prometheus_client and its workers",
}
DEVELOPER_TOOLS = "gateway/tools/"
NAMES = ("environ", "environb", "getenv", "getenvb")


def environment_reads(source: str) -> list[int]:
    """The lines that touch `os.environ` / `os.getenv`, or import them from `os`."""
    return [node.lineno for node in ast.walk(ast.parse(source)) if reads_environment(node)]


def reads_environment(node: ast.AST) -> bool:
    if isinstance(node, ast.Attribute):
        return node.attr in NAMES and isinstance(node.value, ast.Name) and node.value.id == "os"
    if isinstance(node, ast.ImportFrom):
        return node.module == "os" and any(alias.name in NAMES for alias in node.names)
    return False


def test_the_finder_sees_each_way_of_reading():
    source = "import os\nfrom os import environ\na = os.environ['X']\nb = os.getenv('Y')\n"
    assert sorted(environment_reads(source)) == [2, 3, 4]


def test_only_the_settings_loader_reads_the_environment():
    modules = sorted([*(ROOT / "gateway").rglob("*.py"), *(ROOT / "backends").rglob("*.py")])
    assert len(modules) > 50  # the walk found the packages
    readers = {}
    for path in modules:
        name = path.relative_to(ROOT).as_posix()
        if name.startswith(DEVELOPER_TOOLS) or name in ALLOWED:
            continue
        if lines := environment_reads(path.read_text()):
            readers[name] = lines
    assert readers == {}, f"read the environment through Settings.environment instead: {readers}"


@pytest.mark.parametrize("name", sorted(ALLOWED))
def test_each_allowed_module_still_needs_it(name: str):
    assert environment_reads((ROOT / name).read_text()), f"{name} no longer reads it: drop it from ALLOWED"


def test_the_settings_carry_what_the_environment_said(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    config = tmp_path / "config.yaml"
    config.write_text("deployments: [{name: echo, backend: echo, models: ['*']}]\n")
    environ = {
        "CHATGATE_ACCESS_LOG": "1",
        "OTEL_TRACES_EXPORTER": " OTLP ",
        "OTEL_SERVICE_NAME": "edge-1",
        "PROMETHEUS_MULTIPROC_DIR": "/tmp/m",
        "HTTPS_PROXY": "http://proxy:3128",
        "no_proxy": "internal",
        "UNRELATED": "x",
    }
    environment = load_settings(config, environ).environment
    assert environment.access_log and environment.tracing_asked
    assert (environment.service_name, environment.metrics_dir) == ("edge-1", "/tmp/m")
    assert environment.proxies == {"HTTPS_PROXY": "http://proxy:3128", "no_proxy": "internal"}
    # made without the loader, the settings take the process's environment when they are made
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    monkeypatch.delenv("CHATGATE_ACCESS_LOG", raising=False)
    assert not Settings().environment.tracing_asked
    assert not Settings().environment.access_log
