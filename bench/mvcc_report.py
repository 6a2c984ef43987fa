"""The mvcc benchmark's results as a Markdown table with end/start ratios, and as a PNG plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["markdown", "plot", "summary"]

_MB = 1024 * 1024


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Start (last interval before the hold), end (last interval of the hold) and ratios."""
    before = [row for row in rows if row["phase"] == "before"]
    held = [row for row in rows if row["phase"] == "held"]
    if not before or not held:
        return {}
    start, end = before[-1], held[-1]

    def ratio(key: str) -> float | None:
        if not start[key] or end[key] is None:
            return None
        return float(end[key]) / float(start[key])

    return {
        "start": start,
        "end": end,
        "p99_ratio": ratio("p99_ms"),
        "p50_ratio": ratio("p50_ms"),
        "throughput_ratio": ratio("claimed_per_s"),
        "size_ratio": (end["table_bytes"] + end["index_bytes"])
        / max(1, start["table_bytes"] + start["index_bytes"]),
    }


def markdown(found: dict[str, Any]) -> str:
    """The ratios first, then every interval of every system, then the EXPLAIN output."""
    options = found["options"]
    lines = [
        f"# Long transaction: {options['minutes']:g} min held, {options['rate']} jobs/s offered "
        "to each system",
        "",
        f"Systems ran at the same time, each in its own database. Load average (1/5/15 min) "
        f"at start {found['load_average_at_start']}, at end {found['load_average_at_end']}.",
        "",
        "| system | p50 start→end ms | p99 start→end ms | p99 end/start | jobs/s start→end | "
        "throughput end/start | backlog at end | table+indexes start→end MB | dead tuples at end |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, data in found["systems"].items():
        s = summary(data["rows"])
        if not s:
            continue
        start, end = s["start"], s["end"]
        lines.append(
            f"| {name} | {_fmt(start['p50_ms'], 2)} → {_fmt(end['p50_ms'], 2)} | "
            f"{_fmt(start['p99_ms'], 2)} → {_fmt(end['p99_ms'], 2)} | {_fmt(s['p99_ratio'], 2)} | "
            f"{_fmt(start['claimed_per_s'], 0)} → {_fmt(end['claimed_per_s'], 0)} | "
            f"{_fmt(s['throughput_ratio'], 2)} | {end['backlog']:,} | "
            f"{(start['table_bytes'] + start['index_bytes']) / _MB:.1f} → "
            f"{(end['table_bytes'] + end['index_bytes']) / _MB:.1f} | {end['dead_tuples']:,} |"
        )
    lines += [
        "",
        "## Every interval",
        "",
        "Claims are timed around the claim statement; sqlqueue's floor probes (a read beside "
        "the claims, on a thread of their own) apart: how many ran and the longest.",
        "",
        "| system | t s | phase | jobs/s | backlog | claims | p50 ms | p99 ms | max ms | "
        "probes | probe max ms | table MB | indexes MB | dead tuples |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, data in found["systems"].items():
        for row in data["rows"]:
            lines.append(
                f"| {name} | {row['t']} | {row['phase']} | {row['claimed_per_s']:.0f} | "
                f"{row['backlog']:,} | {row['claims']} | {_fmt(row['p50_ms'], 2)} | "
                f"{_fmt(row['p99_ms'], 2)} | {_fmt(row.get('max_ms'), 2)} | "
                f"{row.get('probes', 0)} | {_fmt(row.get('probe_max_ms'), 2)} | "
                f"{row['table_bytes'] / _MB:.1f} | "
                f"{row['index_bytes'] / _MB:.1f} | {row['dead_tuples']:,} |"
            )
    lines += ["", "## EXPLAIN (ANALYZE, BUFFERS) of the claim's SELECT", ""]
    for name, data in found["systems"].items():
        for moment, text in data["explains"].items():
            if text:
                lines += [f"### {name}, {moment.replace('_', ' ')}", "", "```", text, "```", ""]
    return "\n".join(lines) + "\n"


def plot(found: dict[str, Any], path: Path) -> None:
    """Four panels over time: claim p99, jobs claimed/s, table+index size, dead tuples."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(2, 2, figsize=(12, 8), sharex=True)
    panels = [
        ("p99_ms", "claim p99 (ms, log)", 1.0),
        ("claimed_per_s", "jobs claimed / s", 1.0),
        ("size", "job table + indexes (MB)", 1.0 / _MB),
        ("dead_tuples", "dead tuples", 1.0),
    ]
    options = found["options"]
    hold = (options["warmup_seconds"], options["warmup_seconds"] + options["minutes"] * 60)
    for axis, (key, title, scale) in zip(axes.flat, panels, strict=True):
        for name, data in found["systems"].items():
            rows = data["rows"]
            xs = [row["t"] for row in rows]
            if key == "size":
                ys = [(row["table_bytes"] + row["index_bytes"]) * scale for row in rows]
            else:
                ys = [None if row[key] is None else row[key] * scale for row in rows]
            axis.plot(xs, ys, marker=".", label=name)
        axis.axvspan(*hold, color="grey", alpha=0.15, label="transaction held")
        axis.set_title(title)
        if key == "p99_ms":
            axis.set_yscale("log")
        axis.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    for axis in axes[1]:
        axis.set_xlabel("seconds")
    figure.suptitle(
        f"{options['rate']} jobs/s offered to each system; a REPEATABLE READ transaction held "
        f"{options['minutes']:g} min in each database"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
