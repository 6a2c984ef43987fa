"""What draining two-step chains costs per job against plain jobs, counted rather than timed, so
the figures survive a busy machine: statements and commits the worker's engine sends, the
worker process's CPU, and (PostgreSQL on this machine) the CPU of the server processes that
served its connections, read from ``/proc``.

Each variant drains ``--jobs`` no-op jobs in a fresh database with one burst worker in this
process (concurrency 10, as bench/workflows.py), the variants taking turns ``--runs`` times.

``python -m bench.workflow_counts --backends postgresql --runs 2``
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

import sqlqueue
from bench.databases import BACKENDS, DEFAULT_POSTGRES_URL, Target, fresh_database
from bench.names import NOOP

__all__ = ["count_drain", "main"]

_FIGURES = ("statements", "commits", "client_ms", "server_ms")


def _server_seconds(pids: set[int]) -> float:
    """CPU seconds the server processes ``pids`` have used (0 where ``/proc`` hides them)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def count_drain(url: str, jobs: int, *, chains: bool) -> dict[str, float]:
    """Drain ``jobs`` no-op jobs (plain, or as two-step chains) and return per job: statements,
    commits, the worker's CPU ms and its server processes' CPU ms."""
    queue = sqlqueue.Queue(url)
    queue.task(NOOP)(lambda: None)
    with queue.engine.begin() as conn:
        if chains:
            for _ in range(jobs // 2):
                wf = sqlqueue.Workflow()
                wf.add("first", sqlqueue.JobRequest(job_type=NOOP))
                wf.add("second", sqlqueue.JobRequest(job_type=NOOP), after=["first"])
                queue.enqueue_workflow(conn, wf)
        else:
            queue.enqueue_many(conn, [sqlqueue.JobRequest(job_type=NOOP)] * jobs)
    queue.engine.dispose()  # the worker's connections are new, and counted from their start
    seen = {"statements": 0, "commits": 0}
    pids: set[int] = set()
    postgres = queue.engine.dialect.name == "postgresql"

    def sent(*_: Any) -> None:
        seen["statements"] += 1

    def committed(*_: Any) -> None:
        seen["commits"] += 1

    def connected(dbapi_conn: Any, _: Any) -> None:
        if postgres:
            pids.add(int(dbapi_conn.info.backend_pid))

    sa.event.listen(queue.engine, "after_cursor_execute", sent)
    sa.event.listen(queue.engine, "commit", committed)
    sa.event.listen(queue.engine, "connect", connected)
    before = resource.getrusage(resource.RUSAGE_SELF)
    try:
        queue.worker(concurrency=10, poll_interval=0.05).run(burst=True)
        after = resource.getrusage(resource.RUSAGE_SELF)
        server = _server_seconds(pids)
        unfinished = sa.text("SELECT count(*) FROM sqlqueue_jobs WHERE status <> 'succeeded'")
        with queue.engine.connect() as conn:
            if conn.execute(unfinished).scalar_one():
                raise RuntimeError("the drain left jobs unfinished")
    finally:
        queue.engine.dispose()
    client = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    done = jobs // 2 * 2 if chains else jobs
    return {
        "statements": seen["statements"] / done,
        "commits": seen["commits"] / done,
        "client_ms": client * 1000 / done,
        "server_ms": server * 1000 / done,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Run the counts and print a table (medians of ``--runs``)."""
    parser = argparse.ArgumentParser(prog="python -m bench.workflow_counts", description=__doc__)
    parser.add_argument("--backends", default="postgresql")
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--postgres-url", default=DEFAULT_POSTGRES_URL)
    args = parser.parse_args(argv)
    backends = [name for name in args.backends.split(",") if name]
    if set(backends) - set(BACKENDS):
        parser.error(f"--backends: expected some of {', '.join(BACKENDS)}")
    load = os.getloadavg()
    print(f"{'backend':<12} {'variant':<16} " + " ".join(f"{name:>11}" for name in _FIGURES))
    for backend in backends:
        found: dict[bool, list[dict[str, float]]] = {False: [], True: []}
        for run in range(args.runs):
            for chains in (False, True) if run % 2 == 0 else (True, False):
                with fresh_database(backend, Target(postgres_url=args.postgres_url)) as url:
                    found[chains].append(count_drain(url, args.jobs, chains=chains))
        for chains, runs in found.items():
            medians = [statistics.median(run[name] for run in runs) for name in _FIGURES]
            variant = "two-step chains" if chains else "plain jobs"
            print(f"{backend:<12} {variant:<16} " + " ".join(f"{v:>11.3f}" for v in medians))
    print(
        "per job: statements and commits the worker sent, CPU ms of the worker process and of "
        f"its PostgreSQL server processes; load average at start {load[0]:.1f}, "
        f"at end {os.getloadavg()[0]:.1f}; {time.strftime('%Y-%m-%d')}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
