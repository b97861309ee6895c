"""The benchmark harness (`python -m bench`) runs end to end in its smoke mode and produces a
well-formed table, JSON and chart, with every goal as a row: the peer table (chatgate against
Portkey's gateway, run here as a peer, and the floor), the Messages and Responses dialects
against chat completions, and no figure of another gateway without a source. No timing is
asserted: figures on a shared machine vary. `--show` re-reads the smoke run's JSON, so
`--strict` is checked on figures set by hand rather than on whatever this machine measured.

Needs nginx and wrk (Debian packages, installed by scripts/run-tests), matplotlib, and node
with npm (the first run installs Portkey's pinned gateway into ~/.cache/chatgate-bench).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.servers import ROOT

SMOKE_CONTENDERS = ("direct", "floor", "upstream", "echo", "portkey")
POINT_FIGURES = (
    "rps",
    "p50_ms",
    "p90_ms",
    "p99_ms",
    "requests",
    "seconds",
    "server_cpu",
    "cpu_us_per_request",
)
GOAL_KEYS = {
    "own_work_us_c32", "echo_us_c32", "over_litellm_c32", "over_litellm_c1",
    "added_p50_over_floor_c1_ms", "capped_added_p99_ms", "policy_over_no_policy_c32",
    "traced_over_untraced_c32", "added_first_chunk_p50_ms", "relayed_chunks_per_core_s",
    "rss_growth", "idle_rss_mb", "workers_connection_spread", "workers2_cpu_over_1",
    "streams_errors", "streams_cpu_us_per_chunk", "streams_kb_per_open_stream", "streams_rss_after_over_idle",
    "upstream_over_floor_c32", "over_portkey_c32", "messages_cpu_over_chat_c32",
    "responses_cpu_over_chat_c32", "messages_chunk_over_chat", "responses_chunk_over_chat",
}  # fmt: skip
# what each dialect writes of the upstream's 64 chunks (a role chunk, 61 words, a finish, a usage)
EVENTS_PER_STREAM = {
    "chat": 63,  # the usage chunk is not asked for; [DONE] is not counted
    "messages": 66,  # message_start, content_block_start, 61 deltas, block stop, message_delta, stop
    "responses": 69,  # created, in_progress, item and part added, 61 deltas, text/part/item done, completed
}
NOT_IN_SMOKE = {
    "policy_over_no_policy_c32",
    "traced_over_untraced_c32",
    "over_litellm_c32",
    "over_litellm_c1",
}
CAPPED = {"capped_added_p99_ms", "workers2_cpu_over_1"}  # ERROR when a server cannot keep the rate


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict, Path]:
    out = tmp_path_factory.mktemp("bench")
    run = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", "--with-portkey", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=420,
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
    assert len(relay["rounds_chunks_per_core_s"]) == 1 and relay["chunks_per_core_s"] > 0  # smoke: 1 round
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
        if key in NOT_IN_SMOKE:
            assert row["value"] is None and row["verdict"] == "n/a", row
        elif key in CAPPED and row["verdict"] == "ERROR":
            assert row["error"] and "req/s asked" in row["error"], row
        else:
            assert row["verdict"] in ("PASS", "FAIL"), row
            assert isinstance(row["value"], float)


def test_capped_loads_measured(smoke):
    _, results, _ = smoke
    latency, workers = results["capped"]["latency"], results["capped"]["workers"]
    assert latency["rate"] == results["http"]["floor"]["points"]["32"]["rps"] / 2
    assert workers["rate"] == pytest.approx(results["http"]["upstream"]["points"]["32"]["rps"] * 0.7)
    for section, keys in ((latency, ("direct", "floor", "upstream")), (workers, ("upstream", "workers2"))):
        for key in keys:
            figures = section["points"][key]
            assert figures["errors"] == 0 and figures["rate"] == section["rate"], (key, figures)
            assert figures["rps"] > 0 and figures["cpu_us_per_request"] > 0
    assert results["capped"]["latency"]["points"]["direct"]["rps"] == pytest.approx(latency["rate"], rel=0.1)
    for counts in workers["connections_by_worker"]:
        assert len(counts) == 2 and sum(counts) == 32, counts  # wrk's 32 connections, all found


def test_peers_in_the_full_run_and_when_asked(smoke):
    from bench.run import PROFILES, parse_args, peers_of

    _, results, _ = smoke
    assert peers_of(PROFILES["full"], parse_args([])) == ("portkey", "litellm")
    assert peers_of(PROFILES["full"], parse_args(["--no-peers"])) == ()
    assert peers_of(PROFILES["quick"], parse_args(["--quick"])) == ()
    assert peers_of(PROFILES["quick"], parse_args(["--quick", "--with-litellm"])) == ("litellm",)
    assert results["meta"]["peers"] == ["portkey"] and results["meta"]["with_litellm"] is False
    assert "litellm" not in results["http"]


def test_portkey_peer_table(smoke):
    """Portkey's gateway answered every request of its points through the same nginx, and the peer
    table puts chatgate's req/s over its own, with the goal's verdict from the ratio row."""
    stdout, results, _ = smoke
    ratios = {row["key"]: row for row in results["ratios"]}
    portkey = results["http"]["portkey"]["points"]
    assert ratios["over_portkey_c32"]["value"] == pytest.approx(
        results["http"]["upstream"]["points"]["32"]["rps"] / portkey["32"]["rps"]
    )
    table = stdout[stdout.index("Peers: POST /v1/chat/completions") :].split("\n\n")[0]
    row = next(line for line in table.splitlines() if line.startswith("Portkey gateway 1.15.2"))
    assert f"{portkey['32']['rps']:,.0f}" in row and f"{ratios['over_portkey_c32']['value']:.2f}×" in row
    assert row.split()[-1] == ratios["over_portkey_c32"]["verdict"] and "≥ 5.00×" in row
    litellm = next(line for line in table.splitlines() if line.startswith("LiteLLM 1.80.0"))
    assert "not run: add --with-litellm" in litellm
    floor = next(line for line in table.splitlines() if line.startswith("Python floor"))
    assert "≥ 75.0%" in floor and floor.split()[-1] == ratios["upstream_over_floor_c32"]["verdict"]


def test_dialects_measured(smoke):
    """Messages and Responses through chatgate on the same deployments as chat: plain requests
    at c=32 and streams, each whole, with their ratios to chat's."""
    stdout, results, _ = smoke
    for key in ("messages", "responses"):
        figures = results["http"][key]["points"]["32"]
        assert figures["errors"] == 0 and figures["cpu_us_per_request"] > 0, (key, figures)
    assert results["dialects"]["errors"] == {}
    for name, events in EVENTS_PER_STREAM.items():
        found = results["dialects"]["streams"][name]
        assert found["errors"] == 0 and found["streams"] > 0, (name, found)
        assert found["events_per_stream"] == events, (name, found)
        assert found["cpu_us_per_chunk"] == pytest.approx(found["cpu_us_per_stream"] / 64)
    paired = results["dialects"]["requests"]  # the per-request ratios' own rounds, back to back
    for name in ("chat", "messages", "responses"):
        assert paired[name]["errors"] == 0 and paired[name]["rounds"] == 1, (name, paired[name])
        assert paired[name]["requests"] > 0 and paired[name]["cpu_us_per_request"] > 0, (name, paired[name])
    ratios = {row["key"]: row for row in results["ratios"]}
    over_chat = paired["responses"]["cpu_us_per_request"] / paired["chat"]["cpu_us_per_request"]
    assert ratios["responses_cpu_over_chat_c32"]["value"] == pytest.approx(over_chat)
    assert "1 paired round of 1 s on the chat row's chatgate" in stdout
    chat = results["dialects"]["streams"]["chat"]["cpu_us_per_chunk"]
    messages = results["dialects"]["streams"]["messages"]["cpu_us_per_chunk"]
    # one round: the round's ratio is the ratio of the two figures, on one chatgate
    assert results["dialects"]["streams"]["messages"]["over_chat"] == pytest.approx(messages / chat)
    assert ratios["messages_chunk_over_chat"]["value"] == pytest.approx(messages / chat)
    assert "Dialects: the same deployments on nginx" in stdout


def test_strict_exits_1_on_a_failed_goal(smoke, tmp_path):
    _, results, _ = smoke
    results["memory"]["idle_mb"] = 10.0  # well under its goal
    passing = tmp_path / "passing.json"
    passing.write_text(json.dumps(results))
    results["memory"]["idle_mb"] = 1000.0  # far over it
    failing = tmp_path / "failing.json"
    failing.write_text(json.dumps(results))

    def verdict_and_exit(path: Path, *flags: str) -> tuple[str, int]:
        run = subprocess.run(
            [sys.executable, "-m", "bench", "--show", str(path), *flags],
            cwd=ROOT, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        row = next(line for line in run.stdout.splitlines() if line.startswith("idle RSS"))
        return row.split()[-1], run.returncode

    assert verdict_and_exit(failing) == ("FAIL", 0)
    assert verdict_and_exit(failing, "--strict") == ("FAIL", 1)
    verdict, code = verdict_and_exit(passing, "--strict")
    assert verdict == "PASS"
    others = {row["verdict"] for row in results["ratios"] if row["key"] != "idle_rss_mb"}
    assert code == (1 if others & {"FAIL", "ERROR"} else 0)


def test_table_and_chart(smoke):
    stdout, results, out = smoke
    for label in ("nginx, direct", "Python floor", "chatgate → nginx", "chatgate, echo backend"):
        assert label in stdout
    for title in ("Capped load, latency", "Capped load, scale-out", "connections per worker"):
        assert title in stdout
    for row in results["ratios"]:
        assert row["label"] in stdout
    assert "goals held:" in stdout
    not_run = stdout[stdout.index("Not run here:") :].split("\n\n")[0]
    assert "agentgateway" in not_run and "none has been found with a source" in not_run
    for unsourced in ("42,560", "10,640", "29,719"):  # the old table's figures, from no source
        assert unsourced not in stdout
    proxied = next(line for line in stdout.splitlines() if "requests per core-second" in line)
    per_core = 1e6 / results["http"]["upstream"]["points"]["32"]["cpu_us_per_request"]
    assert f"{per_core:,.0f}" in proxied  # chatgate's own figure, from this run's CPU per request
    assert (out / "latest.png").read_bytes().startswith(b"\x89PNG")
    assert results["meta"]["mode"] == "smoke"


def test_concurrency_point_measured(smoke):
    """The smoke run's concurrency point: 50 slow streams straight from the slow upstream,
    through chatgate and through the floor, every one whole, with each figure the full run
    reports, and chatgate's CPU a chunk set against the floor's."""
    stdout, results, _ = smoke
    entry = results["concurrency"]
    assert "error" not in entry, entry
    point = entry["points"]["50"]
    assert "error" not in point, point
    direct, through, floor = point["direct"], point["chatgate"], point["floor"]
    for found in (direct, through, floor):
        assert found["ok"] == 50 and found["errors"] == 0, found
        assert 0 < found["gap_p50_ms"] <= found["gap_p99_ms"]
    assert direct["chunks"] == floor["chunks"] == 50 * entry["chunks_per_stream"]  # every data event
    assert through["chunks"] == 50 * (entry["chunks_per_stream"] - 1)  # no usage chunk: not asked for
    for found in (through, floor):
        assert found["cpu_us_per_chunk"] > 0 and found["rss_after_mb"] > 0
        assert found["rss_peak_mb"] >= found["rss_before_mb"] > 0
    assert "Concurrency (slow streams open at once" in stdout
    rows = {line.split()[1]: line for line in stdout.splitlines() if line.startswith(f"{50:>9,}  ")}
    assert set(rows) == {"chatgate", "floor"}, rows
    over_floor = next(row for row in results["ratios"] if row["key"] == "streams_chunk_over_floor")
    assert over_floor["value"] == pytest.approx(through["cpu_us_per_chunk"] / floor["cpu_us_per_chunk"])
