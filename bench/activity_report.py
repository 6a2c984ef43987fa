"""``python -m bench.activity_report``: the activity report of ``examples/activity_report.py``
over a million events, chunked into a batch, against a single-job version of the same report.

For each backend: a fresh database, the example's tables, N events generated in the database;
then each version of the report runs on **fresh** worker processes (``--workers`` x
``python -m sqlqueue worker bench.report_app:queue --queues reports --concurrency 1``), whose
RSS is sampled from ``/proc/<pid>/statm`` every 0.1 s:

- ``chunked``: the example's nightly job, a batch of ``--chunks`` chunk jobs (each streams its
  key range and writes its per-user part) and the callback that streams the parts into the CSV;
- ``single``: one job streams every event (``PARTITION_ROWS`` at a time) and writes the CSV;
- ``single, fetch all``: one job fetches every event at once, as naive code does.

Wall time is from the commit that enqueues the report to the run row reading ``ready``; each
version's CSV is checked against totals computed by the database. The table gives each version
against ``single`` (same run, same database). Kept apart from ``python -m bench``::

    python -m bench.activity_report                         # 1,000,000 events, all backends
    python -m bench.activity_report --events 20000 --backends sqlite   # a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa

import sqlqueue
from bench import processes
from bench.activity_example import SINGLE, load_example
from bench.databases import (
    BACKENDS,
    DEFAULT_MYSQL_URL,
    DEFAULT_POSTGRES_URL,
    Target,
    fresh_database,
    git_commit,
)

__all__ = ["Measurement", "main", "measure_backend"]

APP = "bench.report_app:queue"
_MB = 1024 * 1024
#: (label, job type, payload key) of each version; "single" is the baseline.
VERSIONS = ("chunked", "single", "single, fetch all")


@dataclass(kw_only=True)
class Measurement:
    """One version of the report on one backend."""

    backend: str
    version: str
    events: int
    seconds: float
    #: The largest RSS any one worker process reached, and that process's RSS before the run.
    peak_rss_bytes: int
    before_rss_bytes: int
    #: Every worker's peak, in start order.
    worker_peaks: list[int]
    jobs: int


def _run_status(engine: sa.Engine, runs: sa.Table) -> tuple[int, str] | None:
    with engine.connect() as conn:
        row = conn.execute(sa.select(runs.c.id, runs.c.status).order_by(runs.c.id.desc())).first()
    return None if row is None else (int(row[0]), str(row[1]))


def _measure_version(
    version: str,
    *,
    backend: str,
    url: str,
    events: int,
    chunks: int,
    workers: int,
    logs: Path,
    reports: Path,
    timeout: float,
) -> Measurement:
    example = load_example()
    queue: sqlqueue.Queue = example.build_queue(url, schedule=False)
    engine = queue.engine
    command = [sys.executable, "-m", "sqlqueue", "--log-level", "INFO", "worker", APP]
    command += ["--queues", example.REPORTS_QUEUE, "--concurrency", "1", "--poll-interval", "0.05"]
    os.environ[example.REPORTS_DIR_VARIABLE] = str(reports)  # inherited by the workers
    started = [
        processes.start(
            command,
            engine="sqlqueue",
            name=f"{version.replace(' ', '-').replace(',', '')}-{n}",
            url=url,
            logs=logs,
            record=None,
        )
        for n in range(workers)
    ]
    try:
        processes.wait_ready(started, 60.0)
        time.sleep(0.5)
        before = [processes.rss_bytes(w.pid) for w in started]
        peaks = list(before)
        previous = _run_status(engine, example.runs)
        with engine.begin() as conn:
            if version == "chunked":
                queue.enqueue(conn, example.NIGHTLY, {"chunks": chunks})
            else:  # bench.report_app's task, which this queue does not have
                payload = {"stream": version == "single"}
                queue.enqueue(conn, SINGLE, payload, queue=example.REPORTS_QUEUE, external=True)
        began = time.monotonic()
        while True:
            time.sleep(0.1)
            for i, worker in enumerate(started):
                worker.check_alive()
                peaks[i] = max(peaks[i], processes.rss_bytes(worker.pid))
            status = _run_status(engine, example.runs)
            if status is not None and status != previous and status[1] != "processing":
                run_id, outcome = status
                break
            if time.monotonic() - began > timeout:
                raise SystemExit(f"{backend} {version}: the report ran past {timeout:g} s")
        seconds = time.monotonic() - began
        if outcome != "ready":
            raise SystemExit(f"{backend} {version}: run {run_id} ended {outcome}")
        with engine.connect() as conn:
            path = conn.execute(
                sa.select(example.runs.c.path).where(example.runs.c.id == run_id)
            ).scalar_one()
            jobs = conn.execute(sa.text("SELECT count(*) FROM sqlqueue_jobs")).scalar_one()
        if example.csv_totals(Path(path)) != example.expected_totals(engine):
            raise SystemExit(f"{backend} {version}: the CSV's totals differ from the source's")
        busiest = max(range(workers), key=lambda i: peaks[i] - before[i])
        return Measurement(
            backend=backend,
            version=version,
            events=events,
            seconds=seconds,
            peak_rss_bytes=peaks[busiest],
            before_rss_bytes=before[busiest],
            worker_peaks=peaks,
            jobs=int(jobs),
        )
    finally:
        processes.stop_all(started)
        engine.dispose()


def measure_backend(
    backend: str,
    target: Target,
    *,
    events: int,
    chunks: int,
    workers: int,
    timeout: float,
) -> tuple[float, list[Measurement]]:
    """Generate ``events`` on a fresh database, then run every version; return the generation
    time and the measurements."""
    example = load_example()
    with (
        fresh_database(backend, target) as url,
        tempfile.TemporaryDirectory(prefix="sqlqueue-bench-report-") as scratch,
    ):
        engine = sa.create_engine(url)
        try:
            example.app_metadata.create_all(engine)
            began = time.monotonic()
            example.generate_events(engine, events)
            generated = time.monotonic() - began
        finally:
            engine.dispose()
        results = []
        for version in VERSIONS:
            results.append(
                _measure_version(
                    version,
                    backend=backend,
                    url=url,
                    events=events,
                    chunks=chunks,
                    workers=workers,
                    logs=Path(scratch),
                    reports=Path(scratch) / "reports",
                    timeout=timeout,
                )
            )
            print(f"  {backend} {version}: {results[-1].seconds:.1f} s", file=sys.stderr)
    return generated, results


def table(results: list[Measurement], chunks: int, workers: int) -> str:
    """One line per version and backend, with ratios against ``single`` of the same backend."""
    lines = [
        [
            "backend",
            "report",
            "wall s",
            "vs single",
            "worker peak RSS MB",
            "growth MB",
            "vs single",
        ]
    ]
    baseline = {m.backend: m for m in results if m.version == "single"}
    for m in results:
        base = baseline[m.backend]
        growth = (m.peak_rss_bytes - m.before_rss_bytes) / _MB
        base_growth = (base.peak_rss_bytes - base.before_rss_bytes) / _MB
        label = (
            f"chunked: {chunks} chunk jobs + callback, {workers} workers"
            if m.version == "chunked"
            else "one job, streamed"
            if m.version == "single"
            else "one job, every row fetched at once"
        )
        lines.append(
            [
                m.backend,
                label,
                f"{m.seconds:,.1f}",
                f"{m.seconds / base.seconds:.2f}",
                f"{m.peak_rss_bytes / _MB:,.1f}",
                f"{growth:+,.1f}",
                f"{m.peak_rss_bytes / base.peak_rss_bytes:.2f}"
                + (f" (growth {growth / base_growth:.1f}x)" if base_growth > 1 else ""),
            ]
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    text = [
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)) for line in lines
    ]
    text.insert(1, "-" * len(text[0]))
    return "\n".join(row.rstrip() for row in text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.activity_report",
        description=(__doc__ or "").split("\n\n", 1)[0],
        epilog=(__doc__ or "").split("\n\n", 1)[-1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("--events", type=int, default=1_000_000)
    add("--chunks", type=int, default=20)
    add("--workers", type=int, default=2, help="worker processes, concurrency 1 each (2)")
    add("--backends", default=",".join(BACKENDS))
    add("--postgres-url", default=DEFAULT_POSTGRES_URL)
    add("--mysql-url", default=DEFAULT_MYSQL_URL)
    add("--sqlite-dir", type=Path)
    add("--timeout", type=float, default=1800.0, help="per report, seconds")
    add("--json", type=Path, metavar="PATH", help="also write the figures here")
    args = parser.parse_args(argv)
    backends = [name.strip() for name in args.backends.split(",") if name.strip()]
    if not backends or set(backends) - set(BACKENDS):
        parser.error(f"--backends: expected some of {','.join(BACKENDS)}, got {args.backends!r}")
    if args.events < 1 or args.chunks < 1 or args.workers < 1:
        parser.error("--events, --chunks and --workers must be at least 1")
    target = Target(
        postgres_url=args.postgres_url, sqlite_dir=args.sqlite_dir, mysql_url=args.mysql_url
    )
    print(
        f"activity report over {args.events:,} events; commit {git_commit()}; "
        f"{os.cpu_count()} CPUs; load {os.getloadavg()[0]:.1f}"
    )
    results: list[Measurement] = []
    generation: dict[str, float] = {}
    for backend in backends:
        generated, measured = measure_backend(
            backend,
            target,
            events=args.events,
            chunks=args.chunks,
            workers=args.workers,
            timeout=args.timeout,
        )
        generation[backend] = generated
        results += measured
        print(f"{backend}: {args.events:,} events generated in {generated:.1f} s")
    print()
    print(table(results, args.chunks, args.workers))
    print(f"(load at the end {os.getloadavg()[0]:.1f})")
    if args.json:
        document: dict[str, Any] = {
            "commit": git_commit(),
            "events": args.events,
            "chunks": args.chunks,
            "workers": args.workers,
            "generation_seconds": generation,
            "results": [asdict(m) for m in results],
        }
        args.json.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
