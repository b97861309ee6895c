"""bench/instructions.py counts the instructions a request costs with callgrind: the figure comes
from the worker's own dumps, and rounds of the same code agree (that is its point: a count that
a busy machine does not move)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.instructions import dumps, main, summary

ROOT = Path(__file__).resolve().parents[2]


def test_the_summary_line_is_the_count(tmp_path: Path) -> None:
    dump = tmp_path / "callgrind.out.7.2"
    dump.write_text("# callgrind format\nversion: 1\nevents: Ir\nsummary: 123456\ntotals: 150000\n")
    assert summary(dump) == 123456
    (tmp_path / "not-a-dump").write_text("events: Ir\n")
    with pytest.raises(ValueError, match="no summary line"):
        summary(tmp_path / "not-a-dump")


def test_the_dumps_come_in_the_order_callgrind_wrote_them(tmp_path: Path) -> None:
    for name in ("callgrind.out.7", "callgrind.out.7.10", "callgrind.out.7.2", "callgrind.out.8.3"):
        (tmp_path / name).write_text("")
    assert [path.name for path in dumps(tmp_path, 7)] == ["callgrind.out.7.2", "callgrind.out.7.10"]


@pytest.mark.skipif(
    shutil.which("callgrind_control") is None, reason="needs valgrind (scripts/run-tests installs it)"
)
@pytest.mark.timeout(900)  # the gateway starts under callgrind: a minute or two
def test_a_run_counts_each_round_and_the_rounds_agree() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "bench.instructions", "--requests", "20", "--rounds", "2", "--warmup", "10"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    found = re.search(r"median ([\d,]+) \(rounds: ([\d,]+), ([\d,]+); spread ([\d.]+)%\)", run.stdout)
    assert found, run.stdout
    median, first, second = (int(found[k].replace(",", "")) for k in (1, 2, 3))
    # an echo request is hundreds of thousands of instructions (about 880k on 2026-11-29); a
    # figure far from that is a count of something else (the launcher, a shell, nothing)
    assert 100_000 < median < 20_000_000, run.stdout
    assert abs(first - second) / median < 0.03, run.stdout


@pytest.mark.parametrize(
    "asked",
    [
        ["--paced", "0"],
        ["--paced", "20", "--floor", "--dialect", "messages"],
        ["--paced", "20", "--turns", "5"],
    ],
)
def test_a_paced_run_asks_for_a_gap_and_nothing_it_cannot_pace(asked: list[str]) -> None:
    with pytest.raises(SystemExit) as refused:
        main(asked)
    assert refused.value.code == 2


@pytest.mark.skipif(
    shutil.which("callgrind_control") is None, reason="needs valgrind (scripts/run-tests installs it)"
)
@pytest.mark.timeout(900)
def test_a_paced_run_counts_each_chunk_as_its_own_read() -> None:
    """At a model's pace (bench/slow_upstream.py, a chunk every 20 ms) each chunk is a read and a
    wakeup of its own: a streamed request counts more than nginx's all-at-once one (5.7M on
    2026-11-29), and its rounds agree."""
    run = subprocess.run(
        [sys.executable, "-m", "bench.instructions", "--paced", "20", "--requests", "3", "--rounds", "2",
         "--warmup", "2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "an upstream at a chunk every 20 ms, streamed" in run.stdout, run.stdout
    found = re.search(r"median ([\d,]+) \(rounds: ([\d,]+), ([\d,]+); spread", run.stdout)
    assert found, run.stdout
    median, first, second = (int(found[k].replace(",", "")) for k in (1, 2, 3))
    assert 6_000_000 < median < 60_000_000, run.stdout  # about 9.8M on 2026-11-29
    assert abs(first - second) / median < 0.05, run.stdout
    assert re.search(r"instructions per chunk: [\d,]+ \(64 chunks a request\)", run.stdout), run.stdout
