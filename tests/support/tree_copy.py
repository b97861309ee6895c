"""A copy of the checkout to change in a test (a dialect added by the recipe, say), and commands
run inside it with its own code first on the path."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

from tests.support.servers import ROOT

CACHES = ("__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache")


def copy_tree(names: Iterable[str], into: Path) -> Path:
    """`names` (folders and files at the top of the checkout) copied into `into`, caches left out."""
    into.mkdir(parents=True, exist_ok=True)
    ignore = shutil.ignore_patterns(*CACHES)
    for name in names:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, into / name, ignore=ignore)
        else:
            shutil.copy2(ROOT / name, into / name)
    return into


def run_in(tree: Path, command: list[str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """`command` run in `tree`, importing the copy's code; it must succeed."""
    environment = {**os.environ, "PYTHONPATH": str(tree), "MYPY_CACHE_DIR": str(tree / ".mypy_cache")}
    result = subprocess.run(
        command, cwd=tree, env=environment, capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, f"{' '.join(command)}:\n{result.stdout[-4000:]}\n{result.stderr[-3000:]}"
    return result
