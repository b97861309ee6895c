"""The annotations are promises a type checker holds: mypy finds nothing in gateway/ and backends/
(settings in pyproject.toml)."""

from __future__ import annotations

import subprocess
import sys

from tests.support.servers import ROOT


def test_mypy_finds_nothing():
    result = subprocess.run(
        [sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
