"""Layers point one way, and no module imports itself back through others.

    core (gateway/core) ← backends ← gateway ← cli, serving, asgi, tools (gateway/tools)

Every import counts, at any depth (inside functions too) and under TYPE_CHECKING too: an arrow a
type checker sees is an arrow a reader follows. A package's __init__ counts as a module like any
other, so a circle through a registry that imports its members is seen.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.servers import ROOT

PACKAGES = ("gateway", "backends", "generated")
TOP = ("gateway.cli", "gateway.asgi", "gateway.__main__", "gateway.serving", "gateway.tools")
# what each layer may import, besides itself
MAY_IMPORT = {
    "core": {"core"},
    "generated": set(),
    "backends": {"core"},
    "gateway": {"core", "backends", "generated"},
    "top": {"core", "backends", "generated", "gateway"},
}


def layer(module: str) -> str:
    if module == "gateway.core" or module.startswith("gateway.core."):
        return "core"
    if module.startswith(TOP):
        return "top"
    return module.split(".")[0]


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


GRAPH = {name: imports_of(path) - {name} for name, path in MODULES.items()}


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down(module: str):
    own = layer(module)
    upward = sorted(
        target for target in GRAPH[module] if layer(target) != own and layer(target) not in MAY_IMPORT[own]
    )
    assert upward == [], f"{module} ({own}) imports {upward}"


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
