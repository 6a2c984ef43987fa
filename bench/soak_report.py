"""The soak's verdict and how it is shown: the checks, a Markdown note, a PNG plot, a table.

The checks judge the measured samples only (a sample taken during the warm-up has ``"warmup":
true``; shown, not judged), and compare the mean of the last ``compare`` of them with the mean
of the first ``compare`` (5 minutes at the default interval): throughput must stay within 15 %
either way; the costs (pickup p99, table + index size, dead tuples, worker RSS) must not grow by
more than 15 % (one that fell is no sign of wear). And the job table's rows must stay under the
bound its retention sets: every job the offered rate brings in is kept at most the retention
window plus two prune intervals (one waiting for the next pass, one for the pass itself), plus
ten seconds of backlog.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "Check",
    "checks",
    "markdown",
    "measured",
    "plot",
    "row_bound",
    "table",
    "warmup_minutes",
]

TOLERANCE = 0.15
#: (key, label, two-sided): the figures every check compares, first window against last.
FIGURES = (
    ("jobs_per_s", "throughput (jobs/s)", True),
    ("pickup_p99_ms", "pickup p99 (ms)", False),
    ("size_mb", "job table + indexes (MB)", False),
    ("dead_tuples", "dead tuples", False),
    ("worker_rss_mb", "worker RSS, all workers (MB)", False),
)
_BACKLOG_SECONDS = 10.0


@dataclass(frozen=True, kw_only=True)
class Check:
    """One check's figures and verdict."""

    name: str
    first: float | None
    last: float | None
    ratio: float | None
    passed: bool
    rule: str


def row_bound(options: dict[str, Any]) -> int:
    """Most rows the job table may hold with this rate and retention (see the module doc)."""
    kept = float(options["retention_seconds"]) + 2 * float(options["prune_interval_seconds"])
    return round(float(options["rate"]) * (kept + _BACKLOG_SECONDS))


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def measured(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The samples taken after the warm-up (a run saved before warm-ups were sampled has
    only those)."""
    return [row for row in rows if not row.get("warmup", False)]


def warmup_minutes(options: dict[str, Any]) -> float:
    """The run's warm-up (older runs saved it in seconds)."""
    if "warmup_minutes" in options:
        return float(options["warmup_minutes"])
    return float(options.get("warmup_seconds", 0.0)) / 60.0


def checks(rows: list[dict[str, Any]], options: dict[str, Any]) -> list[Check]:
    """Every figure's first window against its last, and the row bound, over the measured
    samples."""
    rows = measured(rows)
    compare = min(options["compare_samples"], len(rows) // 2)
    found: list[Check] = []
    for key, label, two_sided in FIGURES:
        if not rows or key not in rows[0]:
            continue
        if compare == 0:
            found.append(Check(name=label, first=None, last=None, ratio=None, passed=False,
                               rule="needs at least 2 samples"))  # fmt: skip
            continue
        values = [row[key] for row in rows]
        first = _mean([v for v in values[:compare] if v is not None])
        last = _mean([v for v in values[-compare:] if v is not None])
        ratio = None if not first or last is None else last / first
        if first == 0 and last == 0:
            ratio = 1.0
        if two_sided:
            rule = f"last/first within 1 ± {TOLERANCE:.2f}"
            passed = ratio is not None and abs(ratio - 1.0) <= TOLERANCE
        else:
            rule = f"last/first ≤ {1 + TOLERANCE:.2f}"
            passed = ratio is not None and ratio <= 1.0 + TOLERANCE
        found.append(
            Check(name=label, first=first, last=last, ratio=ratio, passed=passed, rule=rule)
        )
    bound = row_bound(options)
    most = max((row["rows"] for row in rows), default=0)
    found.append(
        Check(
            name="job rows (most at any sample)",
            first=None,
            last=float(most),
            ratio=most / bound,
            passed=bool(rows) and most <= bound,
            rule=f"≤ {bound:,} = rate * (retention + 2 * prune interval + {_BACKLOG_SECONDS:g} s)",
        )
    )
    return found


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


_COLUMNS = (
    ("minute", "min", 2),
    ("enqueued_per_s", "enqueued/s", 1),
    ("jobs_per_s", "jobs/s", 1),
    ("pickup_p50_ms", "pickup p50 ms", 1),
    ("pickup_p99_ms", "pickup p99 ms", 1),
    ("row_pickup_p99_ms", "row p99 ms", 1),
    ("rows", "rows", 0),
    ("unfinished", "unfinished", 0),
    ("size_mb", "table+idx MB", 2),
    ("table_mb", "table MB", 2),
    ("indexes_mb", "indexes MB", 2),
    ("file_mb", "file MB", 2),
    ("free_mb", "free MB", 2),
    ("wal_mb", "WAL MB", 2),
    ("live_tuples", "live tuples", 0),
    ("dead_tuples", "dead tuples", 0),
    ("vacuums", "vacuums", 0),
    ("oldest_xact_s", "oldest xact s", 1),
    ("oldest_writer_s", "oldest writer s", 1),
    ("worker_rss_mb", "RSS MB", 1),
    ("load_1m", "load 1m", 2),
)


def _columns(rows: list[dict[str, Any]]) -> list[tuple[str, str, int]]:
    return [column for column in _COLUMNS if rows and column[0] in rows[0]]


def table(backend: str, rows: list[dict[str, Any]], found: list[Check]) -> str:
    """Every sample and every check as plain text, for the terminal."""
    columns = _columns(rows)
    lines = [[label for _, label, _ in columns]]
    lines += [[_fmt(row.get(key), digits) for key, _, digits in columns] for row in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(columns))]
    text = [f"soak [{backend}]"]
    text += [
        "  ".join(cell.rjust(w) for cell, w in zip(line, widths, strict=True)) for line in lines
    ]
    for check in found:
        verdict = "ok" if check.passed else "FAILED"
        text.append(
            f"  {verdict:6} {check.name}: first {_fmt(check.first, 2)}, last "
            f"{_fmt(check.last, 2)}, ratio {_fmt(check.ratio, 3)} ({check.rule})"
        )
    return "\n".join(text)


def markdown(backend: str, found: dict[str, Any], verdict: list[Check]) -> str:
    """The note for ``bench/results/soak-<backend>.md``: setup, checks, every sample."""
    options, rows = found["options"], found["backends"][backend]["rows"]
    compare = min(options["compare_samples"], len(measured(rows)) // 2)
    lines = [
        f"# Soak on {backend}: {options['minutes']:g} min at {options['rate']} jobs/s offered",
        "",
        f"Command: `{found['command']}` (commit {found['commit']}, {found['started_utc']} UTC).",
        "",
        f"{options['workers']} worker processes x concurrency {options['concurrency']}, poll "
        f"interval {options['poll_interval']:g} s; 5 % of jobs fail their first attempt (1 % "
        f"fail all {found['max_attempts']} attempts and end dead), retried after "
        f"{found['retry_seconds']:g} s; retention {options['retention_seconds']:g} s for "
        f"finished jobs, pruned every {options['prune_interval_seconds']:g} s. Samples every "
        f"{options['interval_seconds']:g} s"
        + _warmup_text(rows, options)
        + f"backends ran at the same time ({', '.join(found['backends'])}), each in its own "
        f"database. Load average (1/5/15 min) at start {found['load_average_at_start']}, at "
        f"end {found['load_average_at_end']}; {found['cpus']} CPUs. "
        + (f"SQLite file on {found['sqlite_filesystem']}. " if backend == "sqlite" else "")
        + (f"Autovacuum: {found['autovacuum']}. " if backend == "postgresql" else "")
        + f"Jobs enqueued: {found['backends'][backend]['enqueued']:,}; enqueue errors: "
        f"{found['backends'][backend]['enqueue_errors']}.",
        "",
        _pickup_text(rows),
        "",
        *_writer_text(rows),
        f"## Checks: the last {compare} samples against the first {compare}",
        "",
        "| check | first | last | ratio | rule | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for check in verdict:
        lines.append(
            f"| {check.name} | {_fmt(check.first, 2)} | {_fmt(check.last, 2)} | "
            f"{_fmt(check.ratio, 3)} | {check.rule} | {'ok' if check.passed else 'FAILED'} |"
        )
    columns = _columns(rows)
    lines += [
        "",
        "## Every sample",
        "",
        "| " + " | ".join(label for _, label, _ in columns) + " |",
        "|" + "---|" * len(columns),
    ]
    for row in rows:
        cells = [_fmt(row.get(key), digits) for key, _, digits in columns]
        if row.get("warmup", False):
            cells[0] = f"{cells[0]} *w*"
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _warmup_text(rows: list[dict[str, Any]], options: dict[str, Any]) -> str:
    minutes = warmup_minutes(options)
    if any("warmup" in row for row in rows):
        return (
            f", the first {minutes:g} min a warm-up (sampled, marked *w*, not judged: the "
            "table and its indexes fill to their steady size); "
        )
    return f" after a {minutes:g} min warm-up (not sampled); "


def _pickup_text(rows: list[dict[str, Any]]) -> str:
    if rows and "row_pickup_p99_ms" in rows[0]:
        return (
            "Pickup: from a first attempt's due time (its row's `created_at`, the INSERT's "
            "time, a little before its COMMIT) to its handler's start, on the database clock "
            "(the handlers note `time.time()`, moved by the clock offset measured each sample). "
            "*row p99*: the same to the row's `started_at` (the claim's time, or for a job "
            "claimed ahead of a free slot the time its start was written), shown for "
            "comparison, not judged."
        )
    return (
        "Pickup (a run saved before the handlers' starts were recorded): the row's "
        "`started_at - created_at`, which for a job claimed ahead of a free slot counts its run "
        "and its outcome's write too."
    )


def _writer_text(rows: list[dict[str, Any]]) -> list[str]:
    """The worst sample's oldest transaction holding an id anywhere on the server."""
    held = [row for row in rows if row.get("oldest_writer_s")]
    if not held:
        return []
    worst = max(held, key=lambda row: row["oldest_writer_s"])
    return [
        f"Oldest open transaction holding an id anywhere on the server (its start holds back "
        f"VACUUM in every database, this one's too): at most {worst['oldest_writer_s']:,.0f} s, "
        f"at minute {worst['minute']:g} ({worst['oldest_writer']}).",
        "",
    ]


def plot(backend: str, found: dict[str, Any], path: Path) -> bool:
    """Six panels over the run's minutes; False when matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = found["backends"][backend]["rows"]
    options = found["options"]
    third = ("dead_tuples", "dead tuples") if backend == "postgresql" else ("file_mb", "file MB")
    panels = [
        ("jobs_per_s", "jobs finished / s"),
        ("pickup_p99_ms", "pickup p99 (ms)"),
        ("size_mb", "job table + indexes (MB)"),
        ("rows", "job rows"),
        third,
        ("worker_rss_mb", "worker RSS, all workers (MB)"),
    ]
    figure, axes = plt.subplots(2, 3, figsize=(14, 7), sharex=True)
    xs = [row["minute"] for row in rows]
    warm = [row["minute"] for row in rows if row.get("warmup", False)]
    for axis, (key, title) in zip(axes.flat, panels, strict=True):
        ys = [row.get(key) for row in rows]
        axis.plot(xs, ys, marker=".")
        if warm:
            start = min(warm) - float(options["interval_seconds"]) / 60.0  # its first interval
            axis.axvspan(start, 0.0, color="grey", alpha=0.15, label="warm-up")
        axis.set_title(title)
        axis.grid(alpha=0.3)
        if key == "pickup_p99_ms":
            axis.set_yscale("log")  # a stall's seconds next to a quiet minute's milliseconds
            axis.set_title(f"{title}, log")
        else:
            axis.set_ylim(bottom=0)
        if key == "rows":
            bound = row_bound(options)
            axis.axhline(bound, color="red", linestyle="--", label="retention bound")
            axis.set_ylim(0, bound * 1.1)
            axis.legend(fontsize=8)
    for axis in axes[1]:
        axis.set_xlabel("minutes (warm-up shaded, not judged)")
    figure.suptitle(
        f"Soak on {backend}: {options['rate']} jobs/s offered, 5 % failing, retention "
        f"{options['retention_seconds']:g} s"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return True
