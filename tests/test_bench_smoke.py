"""The benchmark harness (`python -m bench`) runs end to end in its smoke mode and produces a
well-formed table, JSON and chart. No timing is asserted: figures on a shared machine vary.

Needs nginx and wrk (Debian packages, installed by scripts/run-tests) and matplotlib.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.servers import ROOT

SMOKE_CONTENDERS = ("direct", "floor", "upstream", "echo")
POINT_FIGURES = ("rps", "p50_ms", "p90_ms", "p99_ms", "requests", "seconds", "server_cpu")
GOAL_KEYS = {
    "upstream_over_floor_c32", "added_p50_c1_ms", "echo_over_upstream_c32",
    "policy_over_no_policy_c32", "added_first_chunk_p50_ms", "relayed_chunks_per_core_s",
    "rss_growth", "idle_rss_mb", "workers2_over_1_c32",
}  # fmt: skip


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict, Path]:
    out = tmp_path_factory.mktemp("bench")
    run = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout, json.loads((out / "latest.json").read_text()), out


def test_every_smoke_contender_measured_without_errors(smoke):
    _, results, _ = smoke
    for key in SMOKE_CONTENDERS:
        entry = results["http"][key]
        assert entry["error"] is None, (key, entry["error"])
        for connections in ("1", "32"):
            figures = entry["points"][connections]
            assert figures["errors"] == 0, (key, connections, figures)
            for name in POINT_FIGURES:
                assert figures[name] > 0, (key, connections, name, figures)


def test_streams_and_memory_measured(smoke):
    _, results, _ = smoke
    streaming = results["streaming"]
    assert streaming["errors"] == {}
    for source in ("direct", "floor", "chatgate"):
        found = streaming["first_chunk"][source]
        assert found["streams"] > 0 and 0 < found["p50_ms"] <= found["p99_ms"]
    relay = streaming["relay"]
    assert relay["errors"] == 0 and relay["chunks"] > 0 and relay["chunks_per_s"] > 0
    assert relay["chunks_per_stream"] >= 60  # the 64-chunk stream arrived whole
    memory = results["memory"]
    assert memory["requests"] > 0
    assert all(memory[name] > 0 for name in ("idle_mb", "warm_mb", "after_mb"))


def test_ratios_and_verdicts(smoke):
    _, results, _ = smoke
    ratios = {row["key"]: row for row in results["ratios"]}
    assert set(ratios) >= GOAL_KEYS
    for key in GOAL_KEYS:
        row = ratios[key]
        assert row["goal"] is not None
        if key in ("policy_over_no_policy_c32", "workers2_over_1_c32"):  # not in the smoke run
            assert row["value"] is None and row["verdict"] == "n/a"
        else:
            assert row["verdict"] in ("PASS", "FAIL"), row
            assert isinstance(row["value"], float)


def test_table_and_chart(smoke):
    stdout, results, out = smoke
    for label in ("nginx, direct", "Python floor", "chatgate → nginx", "chatgate, echo backend"):
        assert label in stdout
    for row in results["ratios"]:
        assert row["label"] in stdout
    assert "goals held:" in stdout
    assert (out / "latest.png").read_bytes().startswith(b"\x89PNG")
    assert results["meta"]["mode"] == "smoke"
