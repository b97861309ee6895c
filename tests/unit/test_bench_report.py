"""The bench's peer and dialect tables, on figures set by hand: the ratios, each goal's verdict,
why a peer is missing, and no figure of a gateway not run here without its source."""

from __future__ import annotations

from typing import Any

import pytest

from bench import load, report, run


def point(rps: float, cpu_us: float = 300.0) -> dict[str, Any]:
    return {"rps": rps, "cpu_us_per_request": cpu_us, "errors": 0, "p50_ms": 1.0, "p99_ms": 2.0}


def results(mode: str = "full", **http: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = {
        "meta": {"mode": mode},
        "http": {key: {"points": points, "error": None} for key, points in http.items()},
        "dialects": {
            "streams": {
                "chat": {"errors": 0, "cpu_us_per_chunk": 10.0, "events_per_stream": 63, "rounds": 5,
                         "seconds": 2.0},
                "messages": {"errors": 0, "cpu_us_per_chunk": 10.5, "events_per_stream": 66, "rounds": 5,
                             "seconds": 2.0},
                "responses": {"errors": 0, "cpu_us_per_chunk": 12.0, "events_per_stream": 69, "rounds": 5,
                              "seconds": 2.0},
            },
            "errors": {},
        },
    }  # fmt: skip
    found["ratios"] = report.evaluate(found)
    return found


def by_key(found: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {row["key"]: row for row in found["ratios"]}


RUN = results(
    upstream={"1": point(1838), "32": point(3670, 300)},
    portkey={"1": point(1009), "32": point(987)},
    litellm={"1": point(147), "32": point(180)},
    floor={"1": point(3213), "32": point(7238)},
    messages={"32": point(3500, 320)},
    responses={"32": point(3000, 360)},
)


def test_peer_ratios_and_verdicts():
    rows = by_key(RUN)
    assert rows["over_portkey_c32"]["value"] == pytest.approx(3670 / 987)
    assert rows["over_portkey_c32"]["verdict"] == "FAIL"  # 3.72× against ≥ 5×
    assert rows["over_litellm_c32"]["value"] == pytest.approx(3670 / 180)
    assert rows["over_litellm_c32"]["goal"] == 25 and rows["over_litellm_c32"]["verdict"] == "FAIL"
    assert rows["upstream_over_floor_c32"]["verdict"] == "FAIL"  # 51 % against ≥ 75 %
    faster = results(upstream={"32": point(6000)}, portkey={"32": point(1000)}, floor={"32": point(7000)})
    assert by_key(faster)["over_portkey_c32"]["verdict"] == "PASS"
    assert by_key(faster)["upstream_over_floor_c32"]["verdict"] == "PASS"


def test_peer_table_rows():
    table = "\n".join(report.render_peers(RUN))
    portkey = next(line for line in table.splitlines() if line.startswith("Portkey gateway 1.15.2"))
    assert portkey.split()[-3:] == ["≥", "5.00×", "FAIL"]
    assert "1,009" in portkey and "987" in portkey and "1.82×" in portkey and "3.72×" in portkey
    floor = next(line for line in table.splitlines() if line.startswith("Python floor"))
    assert "50.7%" in floor and "≥ 75.0%" in floor and floor.endswith("FAIL")
    assert "requests per core-second" in table


def test_a_missing_peer_says_why():
    quick = results("quick", upstream={"1": point(1000), "32": point(2000)}, floor={"32": point(4000)})
    table = "\n".join(report.render_peers(quick))
    assert "Portkey gateway 1.15.2 → nginx    not run: add --with-portkey (the full run has it)" in table
    assert "not run: add --with-litellm" in table
    failed = results(upstream={"32": point(2000)})
    failed["http"]["portkey"] = {"points": {}, "error": "InstallError: npm ci exited 1"}
    assert "error: InstallError: npm ci exited 1" in "\n".join(report.render_peers(failed))
    assert by_key(quick)["over_portkey_c32"]["verdict"] == "n/a"


def test_dialect_ratios_against_chat():
    rows = by_key(RUN)
    assert rows["messages_cpu_over_chat_c32"]["value"] == pytest.approx(320 / 300)
    assert rows["messages_cpu_over_chat_c32"]["verdict"] == "PASS"
    assert rows["responses_cpu_over_chat_c32"]["verdict"] == "FAIL"  # 1.20× against ≤ 1.10×
    assert rows["messages_chunk_over_chat"]["value"] == pytest.approx(1.05)
    assert rows["responses_chunk_over_chat"]["verdict"] == "FAIL"
    table = "\n".join(report.render_dialects(RUN))
    responses = next(line for line in table.splitlines() if line.startswith("Responses"))
    assert "360 µs" in responses and "1.20×" in responses and "69" in responses


def sample(cpu_us: float, errors: int = 0) -> run.Sample:
    result = load.WrkResult(32, 1000, 4.0, 250.0, 1.0, 2.0, 3.0, errors)
    return run.Sample(result=result, busy=1.0, by_process=[1.0], cpu_us_per_request=cpu_us)


def paired_run(messages: list[float], errors: int = 0) -> dict[str, Any]:
    """RUN with paired rounds: chat at 400 µs then 500 µs (the machine slowed), Messages as given."""
    found = {"chat": [sample(400), sample(500)], "messages": [sample(value, errors) for value in messages]}
    paired = {**RUN, "dialects": {**RUN["dialects"], "requests": run.paired_dialect_figures(found, 2.0)}}
    paired["ratios"] = report.evaluate(paired)
    return paired


def test_paired_rounds_decide_the_per_request_ratio():
    # each round's ratio (1.05, 1.04), not the ratio of medians (467.5 / 450 = 1.039) and not the
    # contender table's rows (320 / 300)
    paired = paired_run([420, 520])
    figures = paired["dialects"]["requests"]
    assert figures["messages"]["over_chat_by_round"] == [1.05, 1.04]
    assert figures["messages"]["over_chat"] == pytest.approx((1.05 + 1.04) / 2)
    assert figures["chat"]["cpu_us_per_request"] == 450 and "over_chat" not in figures["chat"]
    rows = by_key(paired)
    assert rows["messages_cpu_over_chat_c32"]["value"] == pytest.approx(1.045)
    assert rows["messages_cpu_over_chat_c32"]["verdict"] == "PASS"
    # Responses was not in the paired rounds: no figure, rather than the table's minutes-apart one
    assert rows["responses_cpu_over_chat_c32"]["verdict"] == "n/a"
    table = "\n".join(report.render_dialects(paired))
    assert "2 paired rounds of 2 s on the chat row's chatgate, asked in each dialect back to back" in table
    assert "Messages/chat by round 1.04–1.05×" in table
    assert "the contender table's rows (own chatgates): 1.07×" in table
    messages = next(line for line in table.splitlines() if line.startswith("Messages"))
    assert "470 µs" in messages and "1.04×" in messages and "PASS" in messages
    slower = by_key(paired_run([480, 600]))["messages_cpu_over_chat_c32"]
    assert slower["value"] == pytest.approx(1.2) and slower["verdict"] == "FAIL"


def test_paired_stream_rounds_decide_the_per_chunk_ratio():
    paired = results(upstream={"32": point(3000)})
    # per-chunk medians 10.0 and 12.0 (1.20×), but round by round Responses was 1.05× and 1.07×
    paired["dialects"]["streams"]["responses"].update(over_chat_by_round=[1.05, 1.07], over_chat=1.06)
    paired["ratios"] = report.evaluate(paired)
    row = by_key(paired)["responses_chunk_over_chat"]
    assert row["value"] == pytest.approx(1.06) and row["verdict"] == "PASS"
    assert by_key(paired)["messages_chunk_over_chat"]["value"] == pytest.approx(1.05)  # no rounds: medians
    table = "\n".join(report.render_dialects(paired))
    assert "per dialect on the chat row's chatgate" in table and "/chat: the median of each round's" in table


def test_paired_rounds_with_errors_are_no_figure():
    assert by_key(paired_run([420, 520], errors=2))["messages_cpu_over_chat_c32"]["verdict"] == "n/a"


def test_a_stream_with_errors_is_no_figure():
    broken = results(upstream={"32": point(3000)}, messages={"32": point(3000)})
    broken["dialects"]["streams"]["messages"]["errors"] = 3
    broken["ratios"] = report.evaluate(broken)
    assert by_key(broken)["messages_chunk_over_chat"]["verdict"] == "n/a"


def test_gateways_not_run_have_no_unsourced_figure():
    text = "\n".join(report.render_not_run(RUN))
    assert text.strip().startswith("Not run here: agentgateway, Bifrost, TensorZero")
    assert "none has been found with a source" in text
    for item in report.PUBLISHED:  # any figure added later carries all three
        assert item.source.startswith("https://") and item.method and item.date
    with pytest.raises(TypeError):
        report.Published("agentgateway", "29,719 req/s")  # type: ignore[call-arg]


def test_an_older_run_without_dialects_or_peers_renders():
    old = {"meta": {"mode": "full"}, "http": {"upstream": {"points": {"32": point(3000)}, "error": None}}}
    old["ratios"] = report.evaluate(old)
    assert report.render_dialects(old) == []
    assert "not run" in "\n".join(report.render_peers(old))


def test_a_round_without_a_figure_is_left_out_of_the_ratio():
    assert run.over_chat([10.0, None, 12.0], [10.0, 11.0, 10.0]) == {
        "over_chat_by_round": [1.0, 1.2],
        "over_chat": pytest.approx(1.1),
    }
    assert run.over_chat([None], [10.0]) == {"over_chat_by_round": [], "over_chat": None}


def relay_round(chunks: int, cpu: float, errors: int = 0) -> tuple[load.RelayResult, float, float]:
    found = load.RelayResult(
        concurrency=32,
        seconds=1.0,
        streams=chunks // 64,
        chunks=chunks,
        chunks_per_s=float(chunks),
        chunks_per_stream=64.0,
        errors=errors,
        client_cpu=0.5,
    )
    return found, cpu, 1.0


def test_the_relay_rows_figure_is_its_rounds_median():
    """One slow round does not decide chunks per core-second (a single 3 s run read 48k for
    code that read 61k in every other): the median does; the totals are the rounds' sums."""
    rounds = [relay_round(60_000, 1.0), relay_round(30_000, 1.0), relay_round(64_000, 1.0)]
    relay = run.relay_figures(rounds)
    assert relay["chunks_per_core_s"] == 60_000
    assert relay["rounds_chunks_per_core_s"] == [60_000, 30_000, 64_000]
    assert relay["chunks"] == 154_000 and relay["streams"] == sum(found.streams for found, _, _ in rounds)
    assert relay["chunks_per_s"] == pytest.approx(154_000 / 3)
    assert relay["server_cpu"] == pytest.approx(1.0)
    assert report.relay_per_core({"streaming": {"relay": relay}}) == 60_000
    # a run saved before the rounds: its one figure
    old = {key: value for key, value in relay.items() if "core_s" not in key}
    assert report.relay_per_core({"streaming": {"relay": old}}) == pytest.approx(154_000 / 3)
    # any error: no figure
    failed = run.relay_figures([relay_round(60_000, 1.0), relay_round(60_000, 1.0, errors=1)])
    assert report.relay_per_core({"streaming": {"relay": failed}}) is None
