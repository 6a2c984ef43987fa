"""What workflows cost: the enqueue of one 10,000-step workflow, and the drain rate of no-op
jobs run as two-step chains against the same number of plain jobs, measured in the same run.

- **enqueue**: one ``enqueue_workflow`` of ``steps`` steps (a root, ``steps - 2`` steps after
  it, a join after all of those: the bulk insert path, two edges per middle step), timed on
  the wall clock, next to one ``enqueue_many`` of as many plain jobs.
- **drain**: a fresh database with ``jobs`` no-op jobs, either plain or as ``jobs / 2``
  workflows of two steps (the second waits for the first), emptied by one burst worker in this
  process; throughput is jobs divided by the drain window on the database clock (earliest
  ``started_at`` to latest ``finished_at``), as in bench/drain.py. The variants take turns
  (A B B A …) so a machine getting busier weighs on both; the figure is the median of each and
  the ratio chains / plain (the goal on PostgreSQL is at least 0.70).

``python -m bench --only workflows`` (``--runs``, ``--backends``, ``--drain-jobs``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa

import sqlqueue
from bench.databases import Target, fresh_database
from bench.drain import _timestamp as moment
from bench.names import NOOP

__all__ = ["Figure", "measure", "table"]

VARIANTS = ("plain jobs", "two-step chains")


@dataclass(frozen=True, kw_only=True)
class Figure:
    """One backend: enqueue seconds (workflow and plain) and drain rates of each variant."""

    backend: str
    steps: int
    jobs: int
    enqueue_workflow_s: list[float]
    enqueue_plain_s: list[float]
    rates: dict[str, list[float]]

    def median(self, variant: str) -> float:
        """The median drain throughput of ``variant``."""
        return statistics.median(self.rates[variant])

    @property
    def ratio(self) -> float:
        """Chains' drain rate over plain jobs' (1.0: no cost)."""
        return self.median("two-step chains") / self.median("plain jobs")


def _queue(url: str) -> sqlqueue.Queue:
    queue = sqlqueue.Queue(url)
    queue.task(NOOP)(lambda: None)
    return queue


def _enqueue_times(url: str, steps: int) -> tuple[float, float]:
    """Seconds for one ``steps``-step workflow, then for ``steps`` plain jobs (one call each)."""
    queue = _queue(url)
    try:
        wf = sqlqueue.Workflow()
        wf.add("root", sqlqueue.JobRequest(job_type=NOOP))
        middle = [
            wf.add(f"s{n}", sqlqueue.JobRequest(job_type=NOOP), after=["root"])
            for n in range(steps - 2)
        ]
        wf.add("join", sqlqueue.JobRequest(job_type=NOOP), after=middle)
        started = time.perf_counter()
        with queue.engine.begin() as conn:
            queue.enqueue_workflow(conn, wf)
        workflow_s = time.perf_counter() - started
        requests = [sqlqueue.JobRequest(job_type=NOOP) for _ in range(steps)]
        started = time.perf_counter()
        with queue.engine.begin() as conn:
            queue.enqueue_many(conn, requests)
        return workflow_s, time.perf_counter() - started
    finally:
        queue.engine.dispose()


def _drain_once(url: str, jobs: int, concurrency: int, chains: bool) -> float:
    queue = _queue(url)
    try:
        with queue.engine.begin() as conn:
            if chains:
                for _ in range(jobs // 2):
                    wf = sqlqueue.Workflow()
                    wf.add("first", sqlqueue.JobRequest(job_type=NOOP))
                    wf.add("second", sqlqueue.JobRequest(job_type=NOOP), after=["first"])
                    queue.enqueue_workflow(conn, wf)
            else:
                queue.enqueue_many(conn, [sqlqueue.JobRequest(job_type=NOOP)] * jobs)
        queue.worker(concurrency=concurrency, poll_interval=0.05).run(burst=True)
        with queue.engine.connect() as conn:
            counts = sa.text("SELECT status, count(*) FROM sqlqueue_jobs GROUP BY status")
            by_status = {str(status): int(n) for status, n in conn.execute(counts)}
            first, last = conn.execute(
                sa.text("SELECT min(started_at), max(finished_at) FROM sqlqueue_jobs")
            ).one()
        expected = jobs // 2 * 2 if chains else jobs
        if by_status != {"succeeded": expected}:
            raise RuntimeError(f"the drain left {by_status}, expected {expected} succeeded")
        return expected / (moment(last) - moment(first)).total_seconds()
    finally:
        queue.engine.dispose()


def measure(
    backends: Sequence[str],
    target: Target,
    *,
    runs: int,
    steps: int,
    jobs: int,
    concurrency: int,
) -> list[Figure]:
    """Each backend: ``runs`` enqueue timings and ``runs`` drains per variant, alternating."""
    figures = []
    for backend in backends:
        workflow_s: list[float] = []
        plain_s: list[float] = []
        rates: dict[str, list[float]] = {name: [] for name in VARIANTS}
        for run in range(runs):
            with fresh_database(backend, target) as url:
                timing = _enqueue_times(url, steps)
            workflow_s.append(timing[0])
            plain_s.append(timing[1])
            print(f"  {backend} run {run + 1}/{runs} enqueue {steps} steps: {timing[0]:.2f} s "
                  f"(plain {timing[1]:.2f} s)", flush=True)  # fmt: skip
            order = list(VARIANTS) if run % 2 == 0 else list(reversed(VARIANTS))
            for name in order:
                with fresh_database(backend, target) as url:
                    rate = _drain_once(url, jobs, concurrency, name == "two-step chains")
                rates[name].append(rate)
                print(f"  {backend} run {run + 1}/{runs} {name}: {rate:,.0f} jobs/s", flush=True)
        figures.append(
            Figure(
                backend=backend,
                steps=steps,
                jobs=jobs,
                enqueue_workflow_s=workflow_s,
                enqueue_plain_s=plain_s,
                rates=rates,
            )
        )
    return figures


def table(figures: Sequence[Figure]) -> str:
    """The figures as a text table."""
    lines = [
        f"{'backend':<12} {'steps':>6} {'enqueue wf':>11} {'plain':>8} {'jobs':>6} "
        f"{'plain drain':>13} {'chains drain':>14} {'ratio':>6}"
    ]
    for f in figures:
        lines.append(
            f"{f.backend:<12} {f.steps:>6} {statistics.median(f.enqueue_workflow_s):>9.2f} s "
            f"{statistics.median(f.enqueue_plain_s):>6.2f} s {f.jobs:>6} "
            f"{f.median('plain jobs'):>9,.0f} j/s {f.median('two-step chains'):>10,.0f} j/s "
            f"{f.ratio:>6.2f}"
        )
    lines.append(
        "enqueue: one call, median seconds (plain: enqueue_many of as many jobs); drain: median "
        "jobs/s on the database clock; ratio: chains / plain (goal on PostgreSQL: >= 0.70)"
    )
    return "\n".join(lines)
