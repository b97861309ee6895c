"""The figures of one run as a table, ratios with their goals, JSON and a PNG chart.

The results are one plain dict (what latest.json holds); every ratio is computed from it here,
so the table, the JSON and the chart can never disagree.
"""

from __future__ import annotations

import operator
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from bench import fleet

CONNECTIONS = (1, 32)
CONTENDERS = {  # key → label, in table order
    "direct": "nginx, direct",
    "floor": "Python floor (chatgate's client)",
    "upstream": "chatgate → nginx",
    "echo": "chatgate, echo backend",
    "policy": "chatgate → nginx, policy on",
    "traced": "chatgate → nginx, tracing on",
    "sampled": "chatgate → nginx, 1 in 10 traced",
    "workers2": "chatgate → nginx, 2 workers",
    "messages": "chatgate → nginx, Messages",
    "responses": "chatgate → nginx, Responses",
    "portkey": "Portkey gateway 1.15.2 → nginx",
    "litellm": "LiteLLM 1.80.0 → nginx",
}
PEER_FLAGS = {"portkey": "--with-portkey", "litellm": "--with-litellm"}
DIALECT_ROWS = {"chat": "upstream", "messages": "messages", "responses": "responses"}  # → http key
DIALECT_LABELS = {"chat": "chat completions", "messages": "Messages", "responses": "Responses"}
STREAM_SOURCES = {"direct": "nginx, direct", "floor": "Python floor", "chatgate": "chatgate → nginx"}
CAPPED_LABELS = {"upstream": {"workers": "chatgate → nginx, 1 worker"}}  # where a section renames
RATE_TOLERANCE = 0.10  # a capped point off its asked rate by more than this is not a figure

BUSY_WARNING = 0.10  # share of all CPUs busy before the run above which figures are noisy
Results = dict[str, Any]


def point(results: Results, contender: str, connections: int) -> dict[str, Any] | None:
    """A wrk point that ran without errors, else None."""
    entry = results.get("http", {}).get(contender) or {}
    figures = (entry.get("points") or {}).get(str(connections))
    if not figures or figures.get("errors"):
        return None
    return figures


def figure(results: Results, contender: str, connections: int, name: str) -> float | None:
    found = point(results, contender, connections)
    return None if found is None else found[name]


def cpu_per_request(figures: dict[str, Any]) -> float:
    """Microseconds of the server's CPU per request answered (the median over the rounds)."""
    if "cpu_us_per_request" in figures:
        return figures["cpu_us_per_request"]
    return figures["server_cpu"] / figures["rps"] * 1e6 if figures["rps"] else 0.0  # older results


def cpu_us(results: Results, contender: str, connections: int) -> float | None:
    found = point(results, contender, connections)
    return None if found is None else cpu_per_request(found)


def rate_missed_by(figures: dict[str, Any]) -> float:
    """How far a capped point's rate reached is from the rate asked, as a share of it (signed)."""
    return figures["rps"] / figures["rate"] - 1


def capped_point(results: Results, section: str, contender: str) -> dict[str, Any] | None:
    """A capped point that ran without errors at (within 10 % of) the rate asked, else None."""
    found = (((results.get("capped") or {}).get(section) or {}).get("points") or {}).get(contender)
    if not found or found.get("errors") or abs(rate_missed_by(found)) > RATE_TOLERANCE:
        return None
    return found


def rate_missed(section: str, contenders: tuple[str, ...]) -> Callable[[Results], str | None]:
    """What makes a capped goal's measurement invalid: a contender off the rate asked by more
    than 10 % (one that cannot keep up has no latency at that rate), else None."""

    def check(results: Results) -> str | None:
        points = ((results.get("capped") or {}).get(section) or {}).get("points") or {}
        missed = [
            f"{CONTENDERS[key]} reached {found['rps']:,.0f} of the {found['rate']:,.0f} req/s asked"
            for key in contenders
            if (found := points.get(key)) and abs(rate_missed_by(found)) > RATE_TOLERANCE
        ]
        return "; ".join(missed) or None

    return check


def capped(section: str, contender: str, name: str) -> Callable[[Results], float | None]:
    def compute(results: Results) -> float | None:
        found = capped_point(results, section, contender)
        if found is None:
            return None
        return cpu_per_request(found) if name == "cpu_us_per_request" else found[name]

    return compute


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def difference(minuend: float | None, subtrahend: float | None) -> float | None:
    return None if minuend is None or subtrahend is None else minuend - subtrahend


def ttfb(results: Results, source: str) -> float | None:
    found = results.get("streaming", {}).get("first_chunk", {}).get(source)
    return found.get("p50_ms") if found else None


def relay_per_core(results: Results) -> float | None:
    """The rounds' median (a run saved before the relay point had rounds: its one figure)."""
    relay = results.get("streaming", {}).get("relay")
    if not relay or relay.get("errors") or not relay.get("server_cpu"):
        return None
    median = relay.get("chunks_per_core_s")
    return float(median) if median is not None else relay["chunks_per_s"] / relay["server_cpu"]


def rss_growth(results: Results) -> float | None:
    memory = results.get("memory") or {}
    return ratio(difference(memory.get("after_mb"), memory.get("warm_mb")), memory.get("warm_mb"))


def worst_deviation(counts: list[int]) -> float | None:
    """How far the furthest worker is from an even share, as a share of it (20 of 32 over two: 25 %)."""
    total = sum(counts)
    if len(counts) < 2 or not total:
        return None
    even = total / len(counts)
    return max(abs(count - even) for count in counts) / even


def connection_spread(results: Results) -> float | None:
    """The median over the rounds of the worst worker's deviation from an even share.

    The kernel spreads SO_REUSEPORT connections by a hash of their addresses, so one run of
    32 connections over two workers is a coin toss per connection (16 ± 2.8): the median of the
    rounds says how it usually falls; the table shows every round."""
    section = (results.get("capped") or {}).get("workers") or {}
    deviations = [worst_deviation(counts) for counts in section.get("connections_by_worker") or ()]
    found = [deviation for deviation in deviations if deviation is not None]
    return statistics.median(found) if found else None


@dataclass(frozen=True)
class Ratio:
    key: str
    label: str
    compute: Callable[[Results], float | None]
    unit: str = "×"  # "×", "%" (a share), "ms", "µs", "MB", "/s"
    goal: float | None = None
    holds: Callable[[float, float], bool] = operator.ge
    invalid: Callable[[Results], str | None] | None = None  # why a measurement is not one: ERROR

    @property
    def goal_text(self) -> str:
        if self.goal is None:
            return ""
        sign = {operator.ge: "≥", operator.le: "≤", operator.lt: "<", operator.gt: ">"}[self.holds]
        return f"{sign} {format_value(self.goal, self.unit)}"


def rps(contender: str, connections: int = 32) -> Callable[[Results], float | None]:
    return lambda r: figure(r, contender, connections, "rps")


def rps_ratio(top: str, bottom: str, connections: int = 32) -> Callable[[Results], float | None]:
    return lambda r: ratio(rps(top, connections)(r), rps(bottom, connections)(r))


def added_p50(contender: str, base: str) -> Callable[[Results], float | None]:
    return lambda r: difference(figure(r, contender, 1, "p50_ms"), figure(r, base, 1, "p50_ms"))


def capped_added_p99(contender: str) -> Callable[[Results], float | None]:
    return lambda r: difference(
        capped("latency", contender, "p99_ms")(r), capped("latency", "direct", "p99_ms")(r)
    )


def cpu_per_request_of(contender: str, connections: int = 32) -> Callable[[Results], float | None]:
    return lambda r: cpu_us(r, contender, connections)


def dialect_stream(results: Results, name: str) -> dict[str, Any] | None:
    """A dialect's streams measured without errors, else None."""
    found = ((results.get("dialects") or {}).get("streams") or {}).get(name)
    if not found or found.get("errors") or found.get("cpu_us_per_chunk") is None:
        return None
    return found


def paired_requests(results: Results) -> dict[str, Any]:
    """The dialects' paired rounds of CPU per request (bench.run's `dialect_requests`); {} in a
    run that had none (older runs), and so for each figure measured with errors."""
    found = (results.get("dialects") or {}).get("requests") or {}
    return {name: entry for name, entry in found.items() if not entry.get("errors")}


def dialect_cpu_over_chat(name: str) -> Callable[[Results], float | None]:
    """A dialect's CPU µs per request at c=32 over chat completions' (the same deployments): the
    median of the paired rounds' ratios; in a run without them, the contender table's rows."""

    def compute(results: Results) -> float | None:
        if (results.get("dialects") or {}).get("requests"):
            paired = paired_requests(results)
            return (paired.get(name) or {}).get("over_chat") if "chat" in paired else None
        return table_dialect_over_chat(results, name)

    return compute


def table_dialect_over_chat(results: Results, name: str) -> float | None:
    """The same ratio from the contender table's rows (each dialect's medians of 5 rounds)."""
    return ratio(cpu_us(results, DIALECT_ROWS[name], 32), cpu_us(results, "upstream", 32))


def dialect_chunk_over_chat(name: str) -> Callable[[Results], float | None]:
    """A dialect's CPU µs per upstream chunk relayed over chat completions'."""

    def compute(results: Results) -> float | None:
        found, chat = dialect_stream(results, name), dialect_stream(results, "chat")
        if found is None or chat is None:
            return None
        if "over_chat" in found:  # the median of the rounds' ratios, on one chatgate
            return found["over_chat"]
        return ratio(found["cpu_us_per_chunk"], chat["cpu_us_per_chunk"])

    return compute


def own_work(results: Results) -> float | None:
    """CPU µs per request chatgate spends beyond the floor on the same upstream client: its own."""
    return difference(cpu_us(results, "upstream", 32), cpu_us(results, "floor", 32))


def workers_cpu_ratio(results: Results) -> float | None:
    """2 workers' CPU per request over 1 worker's, both at the same capped rate."""
    return ratio(
        capped("workers", "workers2", "cpu_us_per_request")(results),
        capped("workers", "upstream", "cpu_us_per_request")(results),
    )


def largest_concurrency(results: Results, through: str = "chatgate") -> dict[str, Any] | None:
    """chatgate's figures (or the floor's) at the most streams the concurrency point opened
    (8,000 in a full run)."""
    points = (results.get("concurrency") or {}).get("points") or {}
    found = [(int(count), point.get(through)) for count, point in points.items()]
    found = [(count, figures) for count, figures in found if figures]
    return max(found, key=lambda item: item[0])[1] if found else None


def at_most_streams(name: str) -> Callable[[Results], float | None]:
    def compute(results: Results) -> float | None:
        figures = largest_concurrency(results)
        return None if figures is None or figures.get(name) is None else float(figures[name])

    return compute


def rss_after_over_idle(through: str) -> Callable[[Results], float | None]:
    """RSS after the largest burst of streams has closed, over the fresh worker's before it."""

    def compute(results: Results) -> float | None:
        figures = largest_concurrency(results, through)
        return None if figures is None else ratio(figures["rss_after_mb"], figures["rss_before_mb"])

    return compute


def streams_chunk_over_floor(results: Results) -> float | None:
    """At the most streams: chatgate's CPU per chunk over the floor's, relaying the same streams
    in the same run."""
    chatgate, floor = largest_concurrency(results), largest_concurrency(results, "floor")
    if chatgate is None or floor is None:
        return None
    return ratio(chatgate["cpu_us_per_chunk"], floor["cpu_us_per_chunk"])


def streams_at_most(results: Results) -> str:
    points = (results.get("concurrency") or {}).get("points") or {}
    return f"{max(map(int, points)):,}" if points else "the most"


AT_MOST, BELOW = operator.le, operator.lt
RATIOS = [
    Ratio("own_work_us_c32", "chatgate's own work: µs/req over floor, c=32", own_work, "µs", 80, AT_MOST),
    Ratio(
        "upstream_over_floor_c32", "chatgate/floor req/s, c=32", rps_ratio("upstream", "floor"), "%", 0.75
    ),
    Ratio("upstream_over_floor_c1", "chatgate/floor req/s, c=1", rps_ratio("upstream", "floor", 1), "%"),
    Ratio("upstream_over_direct_c32", "chatgate/direct req/s, c=32", rps_ratio("upstream", "direct"), "%"),
    Ratio("upstream_over_direct_c1", "chatgate/direct req/s, c=1", rps_ratio("upstream", "direct", 1), "%"),
    Ratio("echo_us_c32", "chatgate, echo: CPU µs/req, c=32", cpu_per_request_of("echo"), "µs", 90, AT_MOST),
    Ratio("over_portkey_c32", "chatgate/Portkey req/s, c=32", rps_ratio("upstream", "portkey"), "×", 5),
    Ratio("over_portkey_c1", "chatgate/Portkey req/s, c=1", rps_ratio("upstream", "portkey", 1), "×"),
    Ratio("over_litellm_c32", "chatgate/LiteLLM req/s, c=32", rps_ratio("upstream", "litellm"), "×", 25),
    Ratio("over_litellm_c1", "chatgate/LiteLLM req/s, c=1", rps_ratio("upstream", "litellm", 1), "×", 20),
    Ratio("added_p50_c1_ms", "chatgate p50 over direct, c=1", added_p50("upstream", "direct"), "ms"),
    Ratio("floor_added_p50_c1_ms", "floor p50 over direct, c=1", added_p50("floor", "direct"), "ms"),
    Ratio(
        "added_p50_over_floor_c1_ms", "chatgate p50 over floor, c=1", added_p50("upstream", "floor"), "ms",
        0.15, AT_MOST,
    ),
    Ratio(
        "capped_added_p99_ms", "capped: chatgate p99 over direct", capped_added_p99("upstream"), "ms",
        1.0, AT_MOST, rate_missed("latency", ("direct", "upstream")),
    ),
    Ratio("capped_floor_added_p99_ms", "capped: floor p99 over direct", capped_added_p99("floor"), "ms"),
    Ratio(
        "policy_over_no_policy_c32", "policy on/off req/s, c=32", rps_ratio("policy", "upstream"), "%", 0.90
    ),
    Ratio(
        "traced_over_untraced_c32", "tracing on/off req/s, c=32", rps_ratio("traced", "upstream"), "%", 0.85
    ),
    Ratio(
        "sampled_over_untraced_c32", "1 in 10 traced/off req/s, c=32", rps_ratio("sampled", "upstream"), "%"
    ),
    Ratio(
        "added_first_chunk_p50_ms", "chatgate first chunk over direct, p50",
        lambda r: difference(ttfb(r, "chatgate"), ttfb(r, "direct")), "ms", 0.3, AT_MOST,
    ),
    Ratio("relayed_chunks_per_core_s", "chunks relayed per core-second", relay_per_core, "/s", 60_000),
    Ratio("rss_growth", "RSS growth over the requests", rss_growth, "%", 0.02, BELOW),
    Ratio("idle_rss_mb", "idle RSS", lambda r: (r.get("memory") or {}).get("idle_mb"), "MB", 70, AT_MOST),
    Ratio(
        "workers_connection_spread", "2 workers: connections off even share", connection_spread, "%",
        0.20, AT_MOST,
    ),
    Ratio(
        "workers2_cpu_over_1", "2 workers/1 worker CPU µs/req, capped", workers_cpu_ratio, "×",
        1.10, AT_MOST, rate_missed("workers", ("upstream", "workers2")),
    ),
    Ratio("workers2_over_1_c32", "2 workers/1 worker req/s, c=32", rps_ratio("workers2", "upstream"), "×"),
    # every dialect as cheap as chat: the same deployments asked in Messages and Responses
    Ratio(
        "messages_cpu_over_chat_c32", "Messages/chat CPU µs/req, c=32", dialect_cpu_over_chat("messages"),
        "×", 1.10, AT_MOST,
    ),
    Ratio(
        "responses_cpu_over_chat_c32", "Responses/chat CPU µs/req, c=32", dialect_cpu_over_chat("responses"),
        "×", 1.10, AT_MOST,
    ),
    Ratio(
        "messages_chunk_over_chat", "Messages/chat CPU µs/chunk, streams",
        dialect_chunk_over_chat("messages"), "×", 1.10, AT_MOST,
    ),
    Ratio(
        "responses_chunk_over_chat", "Responses/chat CPU µs/chunk, streams",
        dialect_chunk_over_chat("responses"), "×", 1.10, AT_MOST,
    ),
    # the concurrency point, at the most streams it opened; CPU a chunk and RSS after as issue 40
    # states them (issue 30 had asked 15 µs and 1.2×)
    Ratio("streams_errors", "most streams at once: errors", at_most_streams("errors"), "", 0, AT_MOST),
    Ratio(
        "streams_cpu_us_per_chunk", "most streams at once: CPU µs/chunk", at_most_streams("cpu_us_per_chunk"),
        "µs", 20, AT_MOST,
    ),
    Ratio(
        "streams_kb_per_open_stream", "most streams at once: RSS KB/open stream",
        at_most_streams("rss_kb_per_open_stream"), " KB", 40, AT_MOST,
    ),
    Ratio(
        "streams_rss_after_over_idle", "most streams at once: RSS after/idle",
        rss_after_over_idle("chatgate"), "×", 1.3, AT_MOST,
    ),
    Ratio(
        "streams_chunk_over_floor", "most streams at once: chatgate/floor CPU µs/chunk",
        streams_chunk_over_floor, "×",
    ),
    Ratio(
        "floor_streams_rss_after_over_idle", "most streams at once: floor's RSS after/idle",
        rss_after_over_idle("floor"), "×",
    ),
]  # fmt: skip


@dataclass(frozen=True)
class Published:
    """A figure of a gateway that does not run here: shown only with where it comes from, how it
    was measured and when, apart from what this run measured."""

    gateway: str
    figure: str  # as its source states it, with its unit
    source: str  # an address anyone can open again
    method: str  # the machine, the load, the upstream
    date: str  # when it was measured or published


# Gateways the bench cannot run here, and the figures of theirs that have a source. None has yet:
# the per-core table these rows once held came from no source anyone could find again.
NOT_RUN = ("agentgateway", "Bifrost", "TensorZero", "LiteLLM's Rust gateway")
PUBLISHED: tuple[Published, ...] = ()


def evaluate(results: Results) -> list[dict[str, Any]]:
    """Every ratio with its verdict: PASS or FAIL; n/a when not measured in this run (a contender
    not run, or a figure with errors); ERROR when measured but not valid (a capped rate missed)."""
    rows = []
    for item in RATIOS:
        value = item.compute(results)
        error = item.invalid(results) if item.invalid else None
        verdict = None
        if item.goal is not None and error:
            verdict = "ERROR"
        elif item.goal is not None:
            verdict = "n/a" if value is None else ("PASS" if item.holds(value, item.goal) else "FAIL")
        rows.append(
            {
                "key": item.key,
                "label": item.label,
                "value": value,
                "unit": item.unit,
                "goal": item.goal,
                "goal_text": item.goal_text,
                "verdict": verdict,
                "error": error,
            }
        )
    return rows


# ----- text ---------------------------------------------------------------------------------


def cpu_per_stream(relay: dict[str, Any]) -> float:
    streams_per_s = relay["chunks_per_s"] / relay["chunks_per_stream"] if relay["chunks_per_stream"] else 0
    return relay["server_cpu"] / streams_per_s * 1e6 if streams_per_s else 0.0


def format_value(value: float | None, unit: str) -> str:
    if value is None:
        return "n/a"
    if unit == "%":
        return f"{value:.1%}"
    if unit == "×":
        return f"{value:.2f}×"
    if unit == "ms":
        return f"{value:.2f} ms" if abs(value) >= 1 else f"{value:.3f} ms"
    if unit == "µs":
        return f"{value:,.0f} µs"
    if unit == "MB":
        return f"{value:.1f} MB"
    return f"{value:,.0f}{unit}"


def render(results: Results) -> str:
    sections = (
        render_http, render_capped, render_streams, render_dialects, render_memory, render_concurrency,
        render_peers, render_not_run, fleet.render, render_ratios,
    )  # fmt: skip
    return "\n".join(line for section in sections for line in section(results))


def render_http(results: Results) -> list[str]:
    meta = results["meta"]
    lines = [
        f"chatgate bench · {meta['mode']} · medians of {meta.get('rounds', 1)} interleaved rounds of "
        f"{meta['seconds_per_point']:g} s per point · "
        f"servers on CPU {meta['server_cores']}, wrk/nginx/clients on CPU {meta['load_cores']} · "
        f"{meta['started']} · commit {meta.get('chatgate_commit', '?')}",
        *(
            [f"the machine was {meta['busy_before']:.0%} busy before the run: figures are noisy"]
            if meta.get("busy_before", 0) > BUSY_WARNING
            else []
        ),
        "",
        f"{'HTTP: POST /v1/chat/completions':<34}{'c=1':^37}  {'c=32':^37}",
        f"{'contender':<34}" + f"{'req/s':>9}{'p50 ms':>8}{'p99 ms':>8}{'cpu':>6}{'µs/req':>7}  " * 2,
    ]
    for key, label in CONTENDERS.items():
        entry = results["http"].get(key)
        if entry is None:
            continue
        if entry.get("error"):
            lines.append(f"{label:<34}error: {entry['error'].splitlines()[0][:100]}")
            continue
        row = f"{label:<34}"
        for connections in CONNECTIONS:
            figures = entry["points"].get(str(connections))
            row += point_cells(figures) if figures else f"{'—':>9}{'—':>8}{'—':>8}{'—':>6}{'—':>7}  "
        lines.append(row.rstrip())
    flagged = [
        f"{CONTENDERS[key]} c={c}: {figures['errors']} errors"
        for key, entry in results["http"].items()
        for c, figures in (entry.get("points") or {}).items()
        if figures["errors"]
    ]
    if flagged:
        lines.append("! errors or non-2xx answers (figure not used): " + "; ".join(flagged))
    lines.append(
        "cpu: the server's CPU time (all its processes) / wall time; 100% = one core busy; "
        "µs/req: that CPU time per request"
    )
    for key, entry in results["http"].items():
        for c, figures in (entry.get("points") or {}).items():
            split = process_split(figures)
            if key != "direct" and split:
                lines.append(f"    {CONTENDERS[key]}, c={c}: cpu by process {split}")
    return lines


def point_cells(figures: dict[str, Any]) -> str:
    flag = "!" if figures["errors"] else " "
    return (
        f"{figures['rps']:>9,.0f}{figures['p50_ms']:>8.2f}{figures['p99_ms']:>8.2f}"
        f"{figures['server_cpu']:>5.0%}{flag}{cpu_per_request(figures):>7.0f}  "
    )


def process_split(figures: dict[str, Any]) -> str:
    """'58% + 53%' for a server of several busy processes, '' for one."""
    shares = [share for share in figures.get("server_cpu_by_process", ()) if share >= 0.01]
    return " + ".join(f"{share:.0%}" for share in shares) if len(shares) > 1 else ""


CAPPED_TITLES = {
    "latency": "Capped load, latency",
    "workers": "Capped load, scale-out",
}
CAPPED_NOTES = {
    "workers": "the 2 workers run on both CPUs, sharing CPU {load} with wrk and the upstream nginx; "
    "1 worker runs on CPU {server} alone",
}


def render_capped(results: Results) -> list[str]:
    lines: list[str] = []
    for name, section in (results.get("capped") or {}).items():
        title = CAPPED_TITLES.get(name, name)
        lines.append("")
        if section.get("error"):
            lines.append(f"{title}: error: {section['error']}")
            continue
        basis = section["basis"]
        lines += [
            f"{title}: {section['connections']} connections at {section['rate']:,.0f} req/s = "
            f"{basis['share']:.0%} of {CONTENDERS[basis['of']]}'s {basis['rps']:,.0f} req/s at c=32 "
            f"({section['seconds']:g} s × {section['rounds']} rounds)",
            f"{'contender':<34}{'reached':>9}{'p50 ms':>8}{'p99 ms':>8}{'cpu':>6}{'µs/req':>7}",
        ]
        for key, figures in section["points"].items():
            label = CAPPED_LABELS.get(key, {}).get(name, CONTENDERS[key])
            lines.append(f"{label:<34}{point_cells(figures).rstrip()}")
            if abs(missed := rate_missed_by(figures)) > RATE_TOLERANCE:
                lines.append(
                    f"    ! {label} missed the rate asked by {missed:+.1%} "
                    f"(more than ±{RATE_TOLERANCE:.0%}): no figure at that rate"
                )
            if split := process_split(figures):
                lines.append(f"    {label}: cpu by process {split}")
        for key, message in (section.get("errors") or {}).items():
            lines.append(f"{CONTENDERS[key]}: error: {message.splitlines()[0][:100]}")
        if name in CAPPED_NOTES:
            meta = results["meta"]
            lines.append(
                "    " + CAPPED_NOTES[name].format(load=meta["load_cores"], server=meta["server_cores"])
            )
        if by_round := section.get("connections_by_worker"):
            counts = " · ".join("+".join(str(count) for count in counts) for counts in by_round)
            lines.append(f"    connections per worker while wrk ran, by round: {counts}")
        lines.append(
            f"    wrk's timers tick each ms: requests leave about {section['rate'] / 1000:.0f} at a time"
        )
    return lines


def render_streams(results: Results) -> list[str]:
    lines: list[str] = []
    streaming = results.get("streaming") or {}
    first_chunk = streaming.get("first_chunk") or {}
    if first_chunk:
        lines += [
            "",
            f"{'Streams: 64-chunk SSE, first content chunk':<44}{'p50 ms':>8}{'p90 ms':>8}{'p99 ms':>8}",
        ]
        for source, label in STREAM_SOURCES.items():
            found = first_chunk.get(source)
            if found:
                lines.append(
                    f"{label:<44}{found['p50_ms']:>8.2f}{found['p90_ms']:>8.2f}{found['p99_ms']:>8.2f}"
                )
        streams = next(iter(first_chunk.values()))["streams"]
        lines.append(f"{'':<4}({streams} sequential streams each, over the same rounds)")
    for source, message in (streaming.get("errors") or {}).items():
        lines.append(f"{STREAM_SOURCES.get(source, source)}: error: {message.splitlines()[0][:80]}")
    relay = streaming.get("relay")
    if relay:
        lines.append(
            f"relayed by chatgate: {relay['concurrency']} concurrent streams for {relay['seconds']:.1f} s: "
            f"{relay['chunks_per_s']:,.0f} chunks/s, chatgate cpu {relay['server_cpu']:.0%}, "
            f"{relay['chunks_per_stream']:.0f} chunks/stream, {relay['errors']} errors, "
            f"client cpu {relay['client_cpu']:.0%}; chatgate cpu per stream {cpu_per_stream(relay):,.0f} µs"
        )
    return lines


def render_memory(results: Results) -> list[str]:
    memory = results.get("memory")
    if not memory:
        return []
    if memory.get("error"):
        return ["", f"Memory: error: {memory['error']}"]
    lines = [
        "",
        f"Memory (chatgate → nginx, VmRSS): idle {memory['idle_mb']:.1f} MB · after warm-up "
        f"{memory['warm_mb']:.1f} MB · after {memory['requests']:,} more requests "
        f"{memory['after_mb']:.1f} MB",
    ]
    if memory["requests"] < memory["target_requests"]:
        lines.append(f"    (short of the {memory['target_requests']:,} aimed at: the time cap came first)")
    return lines


def render_concurrency(results: Results) -> list[str]:
    entry = results.get("concurrency")
    if not entry:
        return []
    if entry.get("error"):
        return ["", f"Concurrency: error: {entry['error']}"]
    lines = [
        "",
        f"Concurrency (slow streams open at once, {entry['chunks_per_stream']} chunks {entry['gap_ms']} ms "
        f"apart, one worker; deployment {orjson.dumps(entry['settings']).decode()}"
        + (
            "; the floor, bench/floor.py, relays the same streams):"
            if any(point.get("floor") for point in entry["points"].values())
            else "):"
        ),
        f"{'streams':>9}  {'through':<9}{'errors':>7}{'most open':>11}{'cpu µs/chunk':>14}"
        f"{'RSS KB/stream':>15}{'RSS before→peak→after MB':>27}{'after/idle':>12}"
        f"{'gap p99 direct':>16}{'added p99':>11}",
    ]
    for count, point in entry["points"].items():
        direct = point["direct"]
        shown = [(name, point[name]) for name in ("chatgate", "floor") if point.get(name)]
        if not shown or point.get("error"):
            lines.append(f"{int(count):>9,}  error: {point.get('error')}")
        for name, found in shown:
            kinds = ", ".join(f"{n} {kind}" for kind, n in found["error_kinds"].items())
            lines.append(
                f"{int(count):>9,}  {name:<9}{found['errors']:>7,}{found['peak_open']:>11,}"
                f"{format_value(found['cpu_us_per_chunk'], ' µs'):>14}"
                f"{format_value(found['rss_kb_per_open_stream'], ' KB'):>15}"
                f"{found['rss_before_mb']:>9.0f} →{found['rss_peak_mb']:>6.0f} →{found['rss_after_mb']:>6.0f}"
                f"{format_value(ratio(found['rss_after_mb'], found['rss_before_mb']), '×'):>12}"
                f"{direct['gap_p99_ms']:>13.1f} ms"
                + (f"{added:>+8.1f} ms" if (added := found["added_gap_p99_ms"]) is not None else "   (n/a)")
                + (f"   ({kinds})" if kinds else "")
            )
    return lines


def render_dialects(results: Results) -> list[str]:
    """CPU per request (c=32) and per chunk relayed, each dialect against chat completions."""
    dialects = results.get("dialects") or {}
    streams = dialects.get("streams") or {}
    rows = [name for name, key in DIALECT_ROWS.items() if name != "chat" and key in results.get("http", {})]
    if not rows and not streams and not dialects.get("errors"):
        return []
    ratios = {row["key"]: row for row in results.get("ratios") or ()}
    paired = paired_requests(results)
    lines = [
        "",
        "Dialects: the same deployments on nginx asked in each dialect; CPU per request at c=32, per "
        "chunk of the upstream's 64 over 32 streams at once",
        f"{'dialect':<20}{'µs/req':>8}{'/chat':>8}{'goal':>9}{'':>6}{'µs/chunk':>10}{'/chat':>8}{'goal':>9}"
        f"{'':>6}{'events/stream':>15}",
    ]
    for name, key in DIALECT_ROWS.items():
        request = (paired.get(name) or {}).get("cpu_us_per_request") or cpu_us(results, key, 32)
        stream = dialect_stream(results, name)
        if request is None and stream is None:
            continue
        per_request = ratios.get(f"{name}_cpu_over_chat_c32") or {}
        per_chunk = ratios.get(f"{name}_chunk_over_chat") or {}
        lines.append(
            f"{DIALECT_LABELS[name]:<20}{format_value(request, 'µs'):>8}"
            f"{format_value(per_request.get('value'), '×') if name != 'chat' else '':>8}"
            f"{per_request.get('goal_text', ''):>9}{per_request.get('verdict') or '':>6}"
            f"{format_value(stream and stream['cpu_us_per_chunk'], ' µs'):>10}"
            f"{format_value(per_chunk.get('value'), '×') if name != 'chat' else '':>8}"
            f"{per_chunk.get('goal_text', ''):>9}{per_chunk.get('verdict') or '':>6}"
            f"{format_value(stream and stream['events_per_stream'], ''):>15}"
        )
    if chat := paired.get("chat"):
        rounds = f"{chat['rounds']} paired round" + ("s" if chat["rounds"] != 1 else "")
        lines.append(
            f"    µs/req: {rounds} of {chat['seconds']:g} s on the chat row's chatgate, asked in each "
            "dialect back to back; /chat: the median of each round's ratio"
        )
        for name in DIALECT_ROWS:
            if name == "chat" or not (entry := paired.get(name)) or not entry.get("over_chat_by_round"):
                continue
            by_round = sorted(entry["over_chat_by_round"])
            table = table_dialect_over_chat(results, name)
            lines.append(
                f"    {DIALECT_LABELS[name]}/chat by round {by_round[0]:.2f}–{by_round[-1]:.2f}× "
                f"(middle half {by_round[len(by_round) // 4]:.2f}–{by_round[(3 * len(by_round)) // 4]:.2f}×)"
                + (f"; the contender table's rows (own chatgates): {table:.2f}×" if table else "")
            )
    if any(streams.values()):
        first = next(iter(streams.values()))
        paired_streams = any("over_chat" in entry for entry in streams.values())
        lines.append(
            f"    streams: {first['rounds']} rotated rounds of {first['seconds']:g} s per dialect"
            + (" on the chat row's chatgate" if paired_streams else "")
            + "; µs/chunk: its CPU per stream over the upstream's 64 chunks, whatever number of events "
            "it writes" + ("; /chat: the median of each round's ratio" if paired_streams else "")
        )
    for name, message in (dialects.get("errors") or {}).items():
        what = f"{DIALECT_LABELS[name]} streams" if name in DIALECT_LABELS else "paired requests"
        lines.append(f"{what}: error: {message.splitlines()[0][:100]}")
    return lines


def render_peers(results: Results) -> list[str]:
    """chatgate against each peer and the floor, in one run: req/s at c=1 and c=32, the ratios,
    each goal's verdict (from the ratio rows, so the two tables cannot disagree)."""
    ratios = {row["key"]: row for row in results.get("ratios") or ()}
    http = results.get("http", {})
    mode = results.get("meta", {}).get("mode", "")
    lines = [
        "",
        "Peers: POST /v1/chat/completions, the same nginx upstream, every server on the same CPU",
        f"{'':<34}{'req/s':^18}{'chatgate ÷ it':^22}",
        f"{'server':<34}{'c=1':>9}{'c=32':>9}{'c=1':>11}{'c=32':>11}  {'goal, c=32':<12}verdict",
        f"{CONTENDERS['upstream']:<34}{rps_cell(results, 'upstream', 1)}{rps_cell(results, 'upstream', 32)}",
    ]
    rows = (("portkey", "over_portkey"), ("litellm", "over_litellm"), ("floor", "upstream_over_floor"))
    for key, ratio_key in rows:
        label = CONTENDERS[key]
        entry = http.get(key)
        if entry is None:
            flag = PEER_FLAGS.get(key)
            why = f"not run: add {flag} (the full run has it)" if flag and mode != "full" else "not run"
            lines.append(f"{label:<34}{why}")
            continue
        if entry.get("error"):
            lines.append(f"{label:<34}error: {entry['error'].splitlines()[0][:100]}")
            continue
        c1, c32 = ratios.get(f"{ratio_key}_c1") or {}, ratios.get(f"{ratio_key}_c32") or {}
        lines.append(
            f"{label:<34}{rps_cell(results, key, 1)}{rps_cell(results, key, 32)}"
            f"{format_value(c1.get('value'), c1.get('unit', '×')):>11}"
            f"{format_value(c32.get('value'), c32.get('unit', '×')):>11}"
            f"  {c32.get('goal_text', ''):<12}{c32.get('verdict') or ''}".rstrip()
        )
    proxied = cpu_us(results, "upstream", 32)
    if proxied:
        lines.append(
            f"chatgate → nginx: {1e6 / proxied:,.0f} requests per core-second "
            f"(1 s of CPU / {proxied:,.0f} µs per proxied request, c=32)"
        )
    chunk = at_most_streams("cpu_us_per_chunk")(results)
    if chunk is not None:
        floor = largest_concurrency(results, "floor")
        lines.append(
            f"chatgate: {chunk:,.1f} µs of CPU per relayed chunk at {streams_at_most(results)} streams"
            + (f" (the floor: {floor['cpu_us_per_chunk']:,.1f})" if floor else "")
        )
    return lines


def rps_cell(results: Results, key: str, connections: int) -> str:
    value = figure(results, key, connections, "rps")
    return f"{'—' if value is None else f'{value:,.0f}':>9}"


def render_not_run(results: Results) -> list[str]:
    """The gateways that cannot run here; a figure of theirs only with its source, method, date."""
    lines = ["", f"Not run here: {', '.join(NOT_RUN)}."]
    if not PUBLISHED:
        lines.append(
            "    No figure of theirs is shown: none has been found with a source, a method and a date."
        )
    for item in PUBLISHED:
        lines.append(
            f"    {item.gateway}: {item.figure} (published, not measured here: {item.source}; "
            f"{item.method}; {item.date})"
        )
    return lines


def render_ratios(results: Results) -> list[str]:
    lines = ["", f"{'ratio':<46}{'value':>12}  {'goal':<13}verdict"]
    for row in results["ratios"]:
        value = format_value(row["value"], row["unit"])
        lines.append(f"{row['label']:<46}{value:>12}  {row['goal_text']:<13}{row['verdict'] or ''}".rstrip())
    for row in results["ratios"]:
        if row.get("error"):
            lines.append(f"    ERROR, {row['label']}: {row['error']}")
    verdicts = [row["verdict"] for row in results["ratios"]]
    lines.append(
        f"goals held: {verdicts.count('PASS')} of {verdicts.count('PASS') + verdicts.count('FAIL')} "
        f"measured · ERROR (measured, not valid): {verdicts.count('ERROR')} · "
        f"n/a (not measured): {verdicts.count('n/a')} · {results['meta']['elapsed_s']:.0f} s run"
    )
    return lines


def write_json(results: Results, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2) + b"\n")


# ----- chart --------------------------------------------------------------------------------


def draw_chart(results: Results, path: Path) -> None:
    """Throughput and latency per contender, c=1 and c=32, on log scales (nginx is 100× faster)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [k for k in CONTENDERS if point(results, k, 1) or point(results, k, 32)]
    labels = [CONTENDERS[k].replace(", ", ",\n").replace(" → ", "\n→ ").replace(" (", "\n(") for k in keys]
    positions = range(len(keys))
    figure_, (left, right) = plt.subplots(1, 2, figsize=(max(14, 1.9 * len(keys)), 5.5))
    width = 0.38
    for offset, connections in ((-width / 2, 1), (width / 2, 32)):
        values = [figure(results, k, connections, "rps") or 0 for k in keys]
        bars = left.bar([p + offset for p in positions], values, width, label=f"c={connections}")
        left.bar_label(bars, [f"{v:,.0f}" if v else "" for v in values], fontsize=7, rotation=90, padding=2)
    left.set_yscale("log")
    left.set_ylabel("requests/s (log)")
    left.set_title("Throughput")
    width = 0.2
    series = [(1, "p50_ms"), (1, "p99_ms"), (32, "p50_ms"), (32, "p99_ms")]
    for index, (connections, name) in enumerate(series):
        values = [figure(results, k, connections, name) or 0 for k in keys]
        offset = (index - 1.5) * width
        bars = right.bar([p + offset for p in positions], values, width, label=f"{name[:3]} c={connections}")
        right.bar_label(bars, [f"{v:.2f}" if v else "" for v in values], fontsize=6, rotation=90, padding=2)
    right.set_yscale("log")
    right.set_ylabel("latency, ms (log)")
    right.set_title("Latency")
    for axes in (left, right):
        axes.set_xticks(list(positions), labels, fontsize=8)
        axes.legend(fontsize=8)
        axes.margins(y=0.25)
    meta = results["meta"]
    figure_.suptitle(
        f"chatgate bench ({meta['mode']}, medians of {meta.get('rounds', 1)} rounds of "
        f"{meta['seconds_per_point']:g} s per point, {meta['started']})"
    )
    figure_.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure_.savefig(path, dpi=110)
    plt.close(figure_)
