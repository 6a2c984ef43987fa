"""What an empty middleware costs: drain throughput of no-op jobs with no middleware and with
one that only calls ``call_next()``, measured in the same run, alternately.

Each drain gets a fresh database and a backlog of ``jobs`` no-op jobs, then one burst worker
in this process (``concurrency`` slots) empties it; throughput is jobs divided by the drain
window on the database clock (earliest ``started_at`` to latest ``finished_at``), as in
bench/drain.py. The two variants take turns (A B B A …) so that a machine getting busier or
quieter weighs on both alike; the figure is the median of each and the cost in per cent of
the plain drain's throughput.

Throughput on a shared, noisy machine swings by more than the few per cent sought, so each
drain also records the worker process's CPU time per job (``time.process_time`` around the
burst worker's run: every thread of this process, the handlers', the event loop's and the
database thread's; on SQLite the embedded database's work too, on a server backend not the
server's). The robust cost figure is the median, over the runs, of each run's ratio of the
CPU per job with the middleware to that without it — a busy neighbour slows the wall clock,
not the CPU a job takes.

``python -m bench --only middleware`` (``--runs``, ``--backends``, ``--drain-jobs``) or
``python -m bench.middleware``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa

import sqlqueue
from bench.databases import DEFAULT_MYSQL_URL, DEFAULT_POSTGRES_URL, Target, fresh_database
from bench.drain import _timestamp as moment
from bench.names import NOOP

__all__ = ["Figure", "main", "measure", "table"]

#: The variants measured: how many empty middlewares each registers.
VARIANTS = {"no middleware": 0, "1 empty middleware": 1}


@dataclass(frozen=True, kw_only=True)
class Figure:
    """One backend's drains: jobs per second of each variant, every run."""

    backend: str
    jobs: int
    concurrency: int
    runs: dict[str, list[float]]
    #: The handler and middleware kind: ``sync`` or ``async``.
    handler: str = "sync"
    #: The worker process's CPU time per job, in microseconds, of each variant, every run.
    cpu_us: dict[str, list[float]]

    @property
    def name(self) -> str:
        """The backend and the handler kind, as the table names the row."""
        return f"{self.backend}/{self.handler}"

    def median(self, variant: str) -> float:
        """The median throughput of ``variant``."""
        return statistics.median(self.runs[variant])

    @property
    def cost_percent(self) -> float:
        """How much slower the drain with one empty middleware is, in per cent."""
        plain = self.median("no middleware")
        return 100.0 * (plain - self.median("1 empty middleware")) / plain

    def cpu_median(self, variant: str) -> float:
        """The median CPU time per job of ``variant``, in microseconds."""
        return statistics.median(self.cpu_us[variant])

    @property
    def cpu_cost_percent(self) -> float:
        """How much more CPU per job the worker spends with one empty middleware, in per cent:
        the median over the runs of each run's ratio (the two variants of a run drained one
        right after the other)."""
        pairs = zip(self.cpu_us["1 empty middleware"], self.cpu_us["no middleware"], strict=True)
        return 100.0 * (statistics.median(with_ / without for with_, without in pairs) - 1.0)


def _empty(job: sqlqueue.Job, call_next: Callable[[], Any]) -> Any:
    return call_next()


async def _empty_async(job: sqlqueue.Job, call_next: Callable[[], Any]) -> Any:
    return await call_next()


async def _noop_async() -> None:
    return None


def _drain_once(
    url: str, jobs: int, concurrency: int, middlewares: int, handler: str = "sync"
) -> tuple[float, float]:
    """One drain: its throughput (jobs/s, database clock) and the worker's CPU per job (µs).
    ``handler``: a sync no-op handler and sync middleware, or async ones."""
    queue = sqlqueue.Queue(url)
    if handler == "async":
        queue.task(NOOP)(_noop_async)
        for _ in range(middlewares):
            queue.middleware(_empty_async)
    else:
        queue.task(NOOP)(lambda: None)
        for _ in range(middlewares):
            queue.middleware(_empty)
    try:
        with queue.engine.begin() as conn:
            queue.enqueue_many(conn, [sqlqueue.JobRequest(job_type=NOOP) for _ in range(jobs)])
        worker = queue.worker(concurrency=concurrency, poll_interval=0.05)
        cpu_started = time.process_time()
        worker.run(burst=True)
        cpu = time.process_time() - cpu_started
        with queue.engine.connect() as conn:
            counts = sa.text("SELECT status, count(*) FROM sqlqueue_jobs GROUP BY status")
            by_status = {str(status): int(n) for status, n in conn.execute(counts)}
            first, last = conn.execute(
                sa.text("SELECT min(started_at), max(finished_at) FROM sqlqueue_jobs")
            ).one()
        if by_status != {"succeeded": jobs}:
            raise RuntimeError(f"the drain left {by_status}, expected {{'succeeded': {jobs}}}")
        return jobs / (moment(last) - moment(first)).total_seconds(), 1e6 * cpu / jobs
    finally:
        queue.engine.dispose()


def call_overhead_us(repeats: int = 7, calls: int = 20_000) -> float:
    """What one empty middleware adds to one attempt's handler call, in microseconds: the
    planned call of a no-op task with it minus without it, each the best of ``repeats`` timings
    of ``calls`` calls in this thread's CPU time (so other processes on a busy machine do not
    count: far steadier than a drain)."""
    from datetime import UTC, datetime

    from sqlqueue._store.rows import ClaimedJob

    now = datetime.now(UTC)
    job = ClaimedJob(
        id=1,
        job_type=NOOP,
        queue="default",
        priority=0,
        payload={},
        attempt=1,
        max_attempts=3,
        errors=(),
        next_run_at=now,
        created_at=now,
        batch_id=None,
        started_at=now,
        lease_expires_at=now,
    )
    best: dict[int, float] = {}
    for middlewares in (0, 1):
        queue = sqlqueue.Queue(f"sqlite:///{Path(tempfile.mkdtemp()) / 'plan.db'}")  # unused
        task = queue.task(NOOP)(lambda: None)
        for _ in range(middlewares):
            queue.middleware(_empty)
        call = task.plan.call
        timings = []
        for _ in range(repeats):
            started = time.thread_time()
            for _ in range(calls):
                call(job, {})
            timings.append(time.thread_time() - started)
        best[middlewares] = min(timings) / calls
        queue.engine.dispose()
    return (best[1] - best[0]) * 1e6


def measure(
    backends: Sequence[str],
    target: Target,
    *,
    runs: int,
    jobs: int,
    concurrency: int,
    handlers: Sequence[str] = ("sync",),
) -> list[Figure]:
    """Drain ``jobs`` no-op jobs ``runs`` times per variant on each backend and handler kind,
    the two variants alternating (A B B A …)."""
    figures = []
    for backend in backends:
        for handler in handlers:
            found: dict[str, list[float]] = {name: [] for name in VARIANTS}
            cpu: dict[str, list[float]] = {name: [] for name in VARIANTS}
            for run in range(runs):
                order = list(VARIANTS) if run % 2 == 0 else list(reversed(VARIANTS))
                for name in order:
                    with fresh_database(backend, target) as url:
                        rate, cpu_us = _drain_once(url, jobs, concurrency, VARIANTS[name], handler)
                    found[name].append(rate)
                    cpu[name].append(cpu_us)
                    print(
                        f"  {backend} {handler} run {run + 1}/{runs} {name}: {rate:,.0f} jobs/s, "
                        f"{cpu_us:,.0f} µs CPU per job",
                        flush=True,
                    )
            figures.append(
                Figure(
                    backend=backend,
                    jobs=jobs,
                    concurrency=concurrency,
                    runs=found,
                    cpu_us=cpu,
                    handler=handler,
                )
            )
    return figures


def table(figures: Sequence[Figure], overhead_us: float | None = None) -> str:
    """The figures as a text table (with ``overhead_us``: what that is per job, against each
    drain's time per job)."""
    lines = [
        f"{'backend':<12} {'jobs':>6} {'slots':>5} {'no middleware':>15} "
        f"{'1 empty middleware':>19} {'cost':>7}"
    ]
    for figure in figures:
        lines.append(
            f"{figure.name:<12} {figure.jobs:>6} {figure.concurrency:>5} "
            f"{figure.median('no middleware'):>11,.0f} j/s "
            f"{figure.median('1 empty middleware'):>15,.0f} j/s {figure.cost_percent:>6.1f}%"
        )
    lines.append(
        "jobs/s: median of the runs, drain window on the database clock; cost: how much lower "
        "the throughput with one middleware that only calls call_next() is"
    )
    lines.append("")
    lines.append(f"{'backend':<12} {'CPU/job, none':>14} {'CPU/job, 1 empty':>17} {'CPU cost':>9}")
    for figure in figures:
        lines.append(
            f"{figure.name:<12} {figure.cpu_median('no middleware'):>11,.1f} µs "
            f"{figure.cpu_median('1 empty middleware'):>14,.1f} µs "
            f"{figure.cpu_cost_percent:>8.2f}%"
        )
    lines.append(
        "CPU/job: the worker process's CPU time per job (process_time), median of the runs; "
        "CPU cost: median over the runs of each run's with/without ratio, minus one"
    )
    if overhead_us is not None:
        lines.append(f"one empty middleware adds {overhead_us:.2f} µs to each attempt's call;")
        for figure in figures:
            per_job_us = 1e6 / figure.median("no middleware")
            cpu_us = figure.cpu_median("no middleware")
            lines.append(
                f"  {figure.name}: {100 * overhead_us / per_job_us:.2f} % of its "
                f"{per_job_us:,.0f} µs per job without middleware (wall clock), "
                f"{100 * overhead_us / cpu_us:.2f} % of its {cpu_us:,.0f} µs CPU per job"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bench.middleware``."""
    parser = argparse.ArgumentParser(prog="python -m bench.middleware", description=__doc__)
    parser.add_argument("--backends", default="sqlite", help="sqlite,postgresql,mysql (sqlite)")
    parser.add_argument("--runs", type=int, default=7, help="drains per variant (7)")
    parser.add_argument("--handlers", default="sync", help="sync,async (sync)")
    parser.add_argument("--jobs", type=int, default=5000, help="jobs per drain (5000)")
    parser.add_argument("--concurrency", type=int, default=10, help="worker slots (10)")
    args = parser.parse_args(argv)
    figures = measure(
        [name.strip() for name in args.backends.split(",") if name.strip()],
        Target(postgres_url=DEFAULT_POSTGRES_URL, mysql_url=DEFAULT_MYSQL_URL),
        runs=args.runs,
        jobs=args.jobs,
        concurrency=args.concurrency,
        handlers=[name.strip() for name in args.handlers.split(",") if name.strip()],
    )
    print(table(figures, call_overhead_us()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
