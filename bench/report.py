"""The figures of one run as a table, ratios with their goals, JSON and a PNG chart.

The results are one plain dict (what latest.json holds); every ratio is computed from it here,
so the table, the JSON and the chart can never disagree.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

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
}
STREAM_SOURCES = {"direct": "nginx, direct", "floor": "Python floor", "chatgate": "chatgate → nginx"}

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
    relay = results.get("streaming", {}).get("relay")
    if not relay or relay.get("errors") or not relay.get("server_cpu"):
        return None
    return relay["chunks_per_s"] / relay["server_cpu"]


def rss_growth(results: Results) -> float | None:
    memory = results.get("memory") or {}
    return ratio(difference(memory.get("after_mb"), memory.get("warm_mb")), memory.get("warm_mb"))


@dataclass(frozen=True)
class Ratio:
    key: str
    label: str
    compute: Callable[[Results], float | None]
    unit: str = "×"  # "×", "%" (a share), "ms", "MB", "/s"
    goal: float | None = None
    holds: Callable[[float, float], bool] = operator.ge

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


RATIOS = [
    Ratio("upstream_over_floor_c32", "chatgate/floor req/s, c=32", rps_ratio("upstream", "floor"), "%", 0.60),
    Ratio("upstream_over_floor_c1", "chatgate/floor req/s, c=1", rps_ratio("upstream", "floor", 1), "%"),
    Ratio("upstream_over_direct_c32", "chatgate/direct req/s, c=32", rps_ratio("upstream", "direct"), "%"),
    Ratio("upstream_over_direct_c1", "chatgate/direct req/s, c=1", rps_ratio("upstream", "direct", 1), "%"),
    Ratio(
        "added_p50_c1_ms", "chatgate p50 over direct, c=1", added_p50("upstream", "direct"), "ms",
        1.0, operator.le,
    ),
    Ratio("floor_added_p50_c1_ms", "floor p50 over direct, c=1", added_p50("floor", "direct"), "ms"),
    Ratio("echo_over_upstream_c32", "echo/upstream req/s, c=32", rps_ratio("echo", "upstream"), "×", 2.0),
    Ratio(
        "policy_over_no_policy_c32", "policy on/off req/s, c=32", rps_ratio("policy", "upstream"), "%",
        0.90,
    ),
    Ratio(
        "traced_over_untraced_c32", "tracing on/off req/s, c=32", rps_ratio("traced", "upstream"), "%",
        0.85,
    ),
    Ratio(
        "sampled_over_untraced_c32", "1 in 10 traced/off req/s, c=32", rps_ratio("sampled", "upstream"),
        "%",
    ),
    Ratio(
        "added_first_chunk_p50_ms", "chatgate first chunk over direct, p50",
        lambda r: difference(ttfb(r, "chatgate"), ttfb(r, "direct")), "ms", 1.0, operator.le,
    ),
    Ratio("relayed_chunks_per_core_s", "chunks relayed per core-second", relay_per_core, "/s", 20_000),
    Ratio("rss_growth", "RSS growth over the requests", rss_growth, "%", 0.05, operator.lt),
    Ratio(
        "idle_rss_mb", "idle RSS", lambda r: (r.get("memory") or {}).get("idle_mb"), "MB", 120,
        operator.le,
    ),
    Ratio("workers2_over_1_c32", "2 workers/1 worker, c=32", rps_ratio("workers2", "upstream"), "×", 1.7),
]  # fmt: skip


def evaluate(results: Results) -> list[dict[str, Any]]:
    rows = []
    for item in RATIOS:
        value = item.compute(results)
        verdict = None
        if item.goal is not None:
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
            }
        )
    return rows


# ----- text ---------------------------------------------------------------------------------


def cpu_per_request(figures: dict[str, Any]) -> float:
    """Microseconds of the server's CPU per request answered."""
    return figures["server_cpu"] / figures["rps"] * 1e6 if figures["rps"] else 0.0


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
        return f"{value:.2f} ms"
    if unit == "MB":
        return f"{value:.1f} MB"
    return f"{value:,.0f}{unit}"


def cell(value: float | None, spec: str, width: int) -> str:
    return f"{'—' if value is None else format(value, spec):>{width}}"


def render(results: Results) -> str:
    meta = results["meta"]
    lines = [
        f"chatgate bench · {meta['mode']} · medians of {meta.get('rounds', 1)} interleaved rounds of "
        f"{meta['seconds_per_point']:g} s per point · "
        f"servers on CPU {meta['server_cores']}, wrk/nginx/clients on CPU {meta['load_cores']} · "
        f"{meta['started']}",
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
            lines.append(f"{label:<34}error: {entry['error'].splitlines()[0][:80]}")
            continue
        row = f"{label:<34}"
        for connections in CONNECTIONS:
            figures = entry["points"].get(str(connections))
            if figures is None:
                row += f"{'—':>9}{'—':>8}{'—':>8}{'—':>6}{'—':>7}  "
                continue
            flag = "!" if figures["errors"] else ""
            row += (
                f"{figures['rps']:>9,.0f}{figures['p50_ms']:>8.2f}{figures['p99_ms']:>8.2f}"
                f"{figures['server_cpu']:>5.0%}{flag or ' '}{cpu_per_request(figures):>7.0f}  "
            )
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
            shares = [share for share in figures.get("server_cpu_by_process", ()) if share >= 0.01]
            if key != "direct" and len(shares) > 1:
                split = " + ".join(f"{share:.0%}" for share in shares)
                lines.append(f"    {CONTENDERS[key]}, c={c}: cpu by process {split}")

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
    memory = results.get("memory")
    if memory:
        if memory.get("error"):
            lines += ["", f"Memory: error: {memory['error']}"]
        else:
            lines += [
                "",
                f"Memory (chatgate → nginx, VmRSS): idle {memory['idle_mb']:.1f} MB · after warm-up "
                f"{memory['warm_mb']:.1f} MB · after {memory['requests']:,} more requests "
                f"{memory['after_mb']:.1f} MB",
            ]
            if memory["requests"] < memory["target_requests"]:
                lines.append(
                    f"    (short of the {memory['target_requests']:,} aimed at: the time cap came first)"
                )

    lines += ["", f"{'ratio':<42}{'value':>12}  {'goal':<12}verdict"]
    for row in results["ratios"]:
        value = format_value(row["value"], row["unit"])
        lines.append(f"{row['label']:<42}{value:>12}  {row['goal_text']:<12}{row['verdict'] or ''}".rstrip())
    held = [r for r in results["ratios"] if r["verdict"] == "PASS"]
    judged = [r for r in results["ratios"] if r["verdict"] in ("PASS", "FAIL")]
    lines.append(f"goals held: {len(held)} of {len(judged)} measured ({meta['elapsed_s']:.0f} s run)")
    return "\n".join(lines)


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
    figure_, (left, right) = plt.subplots(1, 2, figsize=(14, 5.5))
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
