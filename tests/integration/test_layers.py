"""Layers point one way, and no module imports itself back through others.

The floors, lowest first (each may import the floors below it and itself, nothing above):

    core ← generated ← backends ← dialects ← config ← telemetry ← fleet ← policy ← http
         ← probes ← flow (chat, runtime) ← app ← top (server, asgi, cli, tools)

Every import counts, at any depth (inside functions too) and under TYPE_CHECKING too: an arrow a
type checker sees is an arrow a reader follows. A package's __init__ counts as a module like any
other, so a circle through a registry that imports its members is seen. The dialects' modules are
imported by name (gateway/dialects/registry.py, one for each entry of the data registry): those
arrows are added here from the registry itself, so a circle through a dialect is seen too.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.dialects import DEFAULT_MOUNTS
from tests.support.servers import ROOT

PACKAGES = ("gateway", "backends", "generated")
# (floor, the module prefixes on it), lowest first
FLOORS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("core", ("gateway.core",)),
    ("generated", ("generated",)),
    ("backends", ("backends",)),
    ("dialects", ("gateway.dialects",)),
    ("config", ("gateway.config",)),
    ("telemetry", ("gateway.telemetry",)),
    ("fleet", ("gateway.fleet",)),
    ("policy", ("gateway.policy",)),
    ("http", ("gateway.http",)),
    ("probes", ("gateway.probes",)),
    ("flow", ("gateway.chat", "gateway.runtime")),
    ("app", ("gateway.app",)),
    ("top", ("gateway.server", "gateway.asgi", "gateway.cli", "gateway.__main__", "gateway.tools")),
)
HEIGHT = {name: height for height, (name, _) in enumerate(FLOORS)}


def layer(module: str) -> str:
    if module == "gateway":  # the package's own __init__
        return "top"
    for name, prefixes in FLOORS:
        if any(module == prefix or module.startswith(prefix + ".") for prefix in prefixes):
            return name
    raise AssertionError(f"{module} is on no floor: add it to FLOORS")


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


MODULES = modules()


def imports_of(path: Path) -> set[str]:
    """The project modules a file imports (the longest known prefix of each name)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        for name in names:
            while name and name not in MODULES:
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
    return found


# imports made by name at run time (importlib), which the walk above cannot read
BY_NAME = {"gateway.dialects.registry": {f"gateway.dialects.{name}" for name in DEFAULT_MOUNTS}}
GRAPH = {name: (imports_of(path) | BY_NAME.get(name, set())) - {name} for name, path in MODULES.items()}


def test_every_registered_dialect_is_a_module_in_the_walk():
    assert BY_NAME["gateway.dialects.registry"] <= set(MODULES)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down(module: str):
    own = HEIGHT[layer(module)]
    upward = sorted(target for target in GRAPH[module] if HEIGHT[layer(target)] > own)
    assert upward == [], f"{module} ({layer(module)}) imports {upward}"


def test_no_import_cycles():
    """Tarjan's strongly connected components: any component of more than one module is a cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in GRAPH[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(GRAPH):
        if module not in index:
            visit(module)
    assert cycles == []


def test_the_configuration_loads_no_dialect_code():
    """Validating a config (mounts and all) and writing its schema read the data registry only: the
    configuration layer does not depend on the translators."""
    script = (
        "import sys\n"
        "from gateway.config.settings import Settings\n"
        "settings = Settings.model_validate({'mounts': {'azure': '/', 'lmi': None}})\n"
        "assert settings.mounts['azure'] == '' and settings.mounts['openai'] == '/v1', settings.mounts\n"
        "assert 'ovms' in Settings.model_json_schema()['properties']['mounts']['properties']\n"
        "print(sorted(m for m in sys.modules if m.startswith('gateway.dialects.')))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
