"""``python -m bench.prune``: what a first prune of a big history costs the workers.

Fills a fresh database with ``--rows`` finished jobs spread over the last year (as
``bench/operations.py`` does) and a backlog of ``--queued`` due jobs. A worker process then
claims 10 jobs of one queue at a time, "runs" them for ``--work-ms`` (10 ms: a worker is not
in a write transaction all the time) and completes them in its next claim's transaction (the
worker's round trip, ``Store.cycle``), again and again. For ``--baseline`` seconds nothing
else runs; then ``Queue.prune(older_than=3600)`` deletes the history (the jobs the worker
finishes are younger, and stay). Per backend it prints the prune's duration and rate, and the
worker's round trip latency (p50/p99/max) and throughput without and during the prune, with
their ratios. ``--alone`` times the prune with no worker at all.

Figures depend on the machine and its load: compare the two phases of one run.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import time
from typing import Any

import sqlqueue
from bench.databases import DEFAULT_POSTGRES_URL, Target, fresh_database
from bench.operations import QUEUES, Sizes, fill

#: The backends whose history ``bench.operations.fill`` can write.
BACKENDS = ("sqlite", "postgresql")


def _work(url: str, work_ms: float, ready: Any, stop: Any, results: Any) -> None:
    """Claim 10 jobs and complete the previous 10 in one transaction until ``stop``; report
    each round trip as (wall clock at its end, milliseconds, jobs completed)."""
    queue = sqlqueue.Queue(url)
    store = queue.store
    fences: list[tuple[int, int]] = []
    trips: list[tuple[float, float, int]] = []
    while not stop.is_set():
        started = time.perf_counter()
        landed, [claimed] = store.cycle(
            worker_id="bench",
            succeeded=fences,
            failures=(),
            results=None,
            claims=[(QUEUES[:1], 10)],
            job_types=None,
            lease_seconds=60,
        )
        trips.append((time.time(), (time.perf_counter() - started) * 1000, len(landed)))
        fences = [job.fence for job in claimed]
        ready.set()
        time.sleep(work_ms / 1000)
    results.put(trips)


def _phase(trips: list[tuple[float, float, int]], start: float, end: float) -> dict[str, float]:
    """Latency percentiles and throughput of the round trips that ended in [start, end)."""
    inside = [(ms, done) for at, ms, done in trips if start <= at < end]
    ordered = sorted(ms for ms, _ in inside) or [0.0]

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {
        "p50": statistics.median(ordered),
        "p99": at(0.99),
        "max": ordered[-1],
        "jobs_per_s": sum(done for _, done in inside) / max(end - start, 1e-9),
        "trips": len(inside),
    }


def _show(name: str, phase: dict[str, float]) -> str:
    return (
        f"{name:16} p50 {phase['p50']:6.1f} ms  p99 {phase['p99']:7.1f} ms  "
        f"max {phase['max']:7.1f} ms  {phase['jobs_per_s']:7.0f} jobs/s  "
        f"({phase['trips']:,.0f} round trips)"
    )


def measure(backend: str, target: Target, args: argparse.Namespace) -> None:
    """Fill, then run the worker alone and during the prune; print both phases."""
    rows, queued = args.rows, args.queued
    with fresh_database(backend, target) as url:
        queue = sqlqueue.Queue(url)
        took = fill(queue.engine, backend, Sizes(rows, 0, queued))
        queue.admin.fold_all_counts()  # a worker folds the history at start
        if backend == "sqlite":  # the fill's WAL into the file now, not in the baseline
            with queue.engine.connect() as conn:
                conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
        print(f"\n== {backend}: {rows:,} finished + {queued:,} queued (filled in {took:.0f} s)")
        if args.alone:
            started = time.perf_counter()
            deleted = queue.prune(older_than=3600, statuses=("succeeded", "cancelled"))
            took = time.perf_counter() - started
            print(f"prune, no worker: {deleted:,} jobs in {took:.1f} s ({deleted / took:,.0f}/s)")
            return
        context = multiprocessing.get_context("spawn")
        results = context.Queue()
        ready, stop = context.Event(), context.Event()
        process = context.Process(
            target=_work, args=(url, args.work_ms, ready, stop, results), daemon=True
        )
        process.start()
        try:
            if not ready.wait(60):
                raise SystemExit("the worker process did not start")
            alone_from = time.time()
            time.sleep(args.baseline)
            pruning_from = time.time()
            started = time.perf_counter()
            deleted = queue.prune(older_than=3600, statuses=("succeeded", "cancelled"))
            prune_took = time.perf_counter() - started
            pruning_to = time.time()
        finally:
            stop.set()
        trips = results.get(timeout=120)
        process.join(30)
        alone = _phase(trips, alone_from, pruning_from)
        during = _phase(trips, pruning_from, pruning_to)
        print(
            f"prune: {deleted:,} jobs in {prune_took:.1f} s "
            f"({deleted / prune_took:,.0f} jobs/s, batches of 1,000)"
        )
        print(_show("worker alone", alone))
        print(_show("during prune", during))
        print(
            f"ratios during/alone: p99 {during['p99'] / max(alone['p99'], 1e-9):.2f}x, "
            f"throughput {during['jobs_per_s'] / max(alone['jobs_per_s'], 1e-9):.2f}x"
        )
        queue.engine.dispose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.prune", description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000, help="finished jobs (1,000,000)")
    parser.add_argument("--queued", type=int, default=300_000, help="due jobs (300,000)")
    parser.add_argument("--baseline", type=float, default=15.0, help="seconds alone (15)")
    parser.add_argument("--work-ms", type=float, default=10.0, help="ms per claim's jobs (10)")
    parser.add_argument("--alone", action="store_true", help="time the prune with no worker")
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--postgres-url", default=DEFAULT_POSTGRES_URL)
    args = parser.parse_args(argv)
    target = Target(postgres_url=args.postgres_url)
    for backend in args.backends.split(","):
        if backend.strip() not in BACKENDS:
            parser.error(f"--backends: expected some of {','.join(BACKENDS)}, got {backend!r}")
        measure(backend.strip(), target, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
