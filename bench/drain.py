"""Drain throughput: how fast P worker processes empty a backlog of no-op jobs.

Each drain gets a fresh database. The backlog is enqueued with ``enqueue_many`` inside a
transaction that also holds the queue shut (SQLite: ``BEGIN IMMEDIATE``; PostgreSQL:
``LOCK TABLE … IN EXCLUSIVE MODE``, which plain reads pass but claims wait for). The workers
start in burst mode, reach their first claim and block there; the commit then releases the
whole backlog to all of them at once, so interpreter start-up and staggered starts are not
measured. Throughput is jobs divided by the drain window on the database clock: from the
earliest ``started_at`` (first claim) to the latest ``finished_at`` (last completion).

While a PostgreSQL drain runs, ``pg_stat_activity`` is sampled every 0.25 s and the largest
number of connections each worker process held is kept.

The drains alone are ``python -m bench --only drain`` (``--drains 1x10,4x10`` for other
shapes); ``python -m bench --help`` has the whole suite. This module only measures: it imports
nothing that runs the suite, so the suite's modules can all import it.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa

import sqlqueue
from bench import processes
from bench.databases import fresh_database
from bench.names import NOOP
from bench.pg_monitor import Monitor
from bench.settings import Settings

__all__ = ["Drain", "measure", "wait_blocked", "wait_exit"]

#: How long workers get to reach their first claim.
_START_TIMEOUT = 60.0
#: On SQLite the barrier cannot be observed: wait this long after the workers say "ready".
_SQLITE_SETTLE = 0.5


@dataclass(frozen=True, kw_only=True)
class Drain:
    """One drain: how many jobs, the window on the database clock, the wall time."""

    jobs: int
    window_seconds: float
    wall_seconds: float
    #: CPU time (user + system) of all worker processes from the release to their exit.
    worker_cpu_seconds: float
    #: PostgreSQL: the most connections each worker process held at once (sampled).
    connections: dict[str, int] = field(default_factory=dict)
    #: PostgreSQL: transactions (commits + rollbacks) the database ran during the drain.
    transactions: int | None = None

    @property
    def jobs_per_second(self) -> float:
        return self.jobs / self.window_seconds if self.window_seconds > 0 else float("inf")

    @property
    def max_connections_per_process(self) -> int | None:
        return max(self.connections.values()) if self.connections else None

    @property
    def worker_cpu_ms_per_job(self) -> float:
        return self.worker_cpu_seconds * 1000 / self.jobs

    @property
    def transactions_per_job(self) -> float | None:
        return None if self.transactions is None else self.transactions / self.jobs

    def details(self) -> dict[str, Any]:
        """What the JSON keeps of this drain besides its rate."""
        found: dict[str, Any] = {
            "jobs": self.jobs,
            "window_seconds": round(self.window_seconds, 4),
            "wall_seconds": round(self.wall_seconds, 4),
            "worker_cpu_seconds": round(self.worker_cpu_seconds, 3),
        }
        if self.connections:
            found["connections_per_process"] = self.connections
        if self.transactions is not None:
            found["transactions"] = self.transactions
        return found


def _hold_queue(conn: sa.Connection, backend: str) -> None:
    """Open the barrier transaction: claims wait until it commits."""
    if backend == "sqlite":
        conn.exec_driver_sql("BEGIN IMMEDIATE")
    elif backend == "postgresql":
        conn.exec_driver_sql("LOCK TABLE sqlqueue_jobs IN EXCLUSIVE MODE")
    else:  # MariaDB/MySQL: a table lock (SKIP LOCKED skips row locks, it waits for this one)
        conn.exec_driver_sql("LOCK TABLES sqlqueue_jobs WRITE")


def _release_queue(conn: sa.Connection, backend: str) -> None:
    """Commit the backlog and lift the barrier."""
    conn.commit()
    if backend == "mysql":  # a table lock outlives the transaction
        conn.exec_driver_sql("UNLOCK TABLES")


def wait_blocked(workers: Sequence[processes.Worker], monitor: Monitor | None) -> dict[str, int]:
    """Wait until every worker is blocked in its first claim; return their connections."""
    if monitor is None:
        processes.wait_ready(workers, _START_TIMEOUT)
        time.sleep(_SQLITE_SETTLE)
        return {}
    names = {worker.name for worker in workers}
    deadline = time.monotonic() + _START_TIMEOUT
    while not names <= monitor.lock_waiters():
        for worker in workers:
            worker.check_alive()
        if time.monotonic() > deadline:
            raise SystemExit(f"workers did not reach their first claim in {_START_TIMEOUT:g} s")
        time.sleep(0.05)
    return monitor.connections()


def wait_exit(
    workers: Sequence[processes.Worker],
    monitor: Monitor | None,
    timeout: float,
    peak: dict[str, int],
) -> dict[str, int]:
    """Wait for every (burst) worker to exit; return the peak connections per worker."""
    peak = dict(peak)
    deadline = time.monotonic() + timeout
    while any(worker.process.poll() is None for worker in workers):
        for worker in workers:
            worker.check_alive()
        if monitor is not None:
            for name, count in monitor.connections().items():
                peak[name] = max(peak.get(name, 0), count)
        if time.monotonic() > deadline:
            raise SystemExit(f"a drain ran past --timeout {timeout:g} s")
        time.sleep(0.25)
    for worker in workers:
        worker.check_alive()
    return peak


def _timestamp(value: Any) -> datetime:
    return value if isinstance(value, datetime) else datetime.fromisoformat(str(value))


def _database_now(conn: sa.Connection, backend: str) -> datetime:
    clock = {"sqlite": "strftime('%Y-%m-%d %H:%M:%f', 'now')", "mysql": "UTC_TIMESTAMP(6)"}.get(
        backend, "clock_timestamp()"
    )
    return _timestamp(conn.exec_driver_sql(f"SELECT {clock}").scalar_one())


def _window(url: str, jobs: int, released_at: datetime) -> float:
    """Check every job succeeded; return seconds from the first claim to the last completion.

    A claim that waited at the barrier may carry a start time from before the release (on
    PostgreSQL ``statement_timestamp()`` can be the time the statement arrived), so the
    window starts at the release at the earliest.
    """
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            counts = sa.text("SELECT status, count(*) FROM sqlqueue_jobs GROUP BY status")
            by_status = {str(status): int(n) for status, n in conn.execute(counts)}
            first, last = conn.execute(
                sa.text("SELECT min(started_at), max(finished_at) FROM sqlqueue_jobs")
            ).one()
    finally:
        engine.dispose()
    if by_status != {"succeeded": jobs}:
        raise SystemExit(f"the drain left {by_status}, expected {{'succeeded': {jobs}}}")
    return (_timestamp(last) - max(_timestamp(first), released_at)).total_seconds()


def _commands(
    engine: str, process_count: int, concurrency: int, settings: Settings
) -> list[list[str]]:
    if engine == "sqlqueue":
        command = processes.sqlqueue_command(
            concurrency=concurrency, poll_interval=settings.poll_interval, burst=True
        )
    else:
        command = processes.raw_command(
            batch=settings.raw_batch, poll_interval=settings.poll_interval, burst=True
        )
    return [command] * process_count


def _enqueue_backlog(
    queue: sqlqueue.Queue, conn: sa.Connection, jobs: int, job_type: str = NOOP
) -> None:
    requests = [
        sqlqueue.JobRequest(job_type=job_type, payload={"n": n}, external=True) for n in range(jobs)
    ]
    queue.enqueue_many(conn, requests)


def measure(
    *,
    backend: str,
    engine: str,
    process_count: int,
    concurrency: int,
    jobs: int,
    settings: Settings,
    job_type: str = NOOP,
    command: Sequence[str] | None = None,
    queue_options: dict[str, Any] | None = None,
) -> Drain:
    """Drain ``jobs`` pre-queued no-op jobs with ``process_count`` workers of ``engine``
    (``job_type``: the sync or the async no-op; the raw worker runs no handler at all).
    ``command`` replaces each worker's command line (bench/observe.py's launcher), and
    ``queue_options`` go to the Queue that enqueues the backlog."""
    with (
        fresh_database(backend, settings.target) as url,
        tempfile.TemporaryDirectory(prefix="sqlqueue-bench-logs-") as logs,
    ):
        monitor = None
        if backend == "postgresql":
            monitor = Monitor(url, admin_url=settings.target.postgres_url)
        queue = sqlqueue.Queue(url, **(queue_options or {}))
        workers: list[processes.Worker] = []
        children_before = processes.children_cpu_seconds()
        try:
            with queue.engine.connect() as conn:
                _hold_queue(conn, backend)
                _enqueue_backlog(queue, conn, jobs, job_type)
                commands = (
                    [list(command)] * process_count
                    if command is not None
                    else _commands(engine, process_count, concurrency, settings)
                )
                for number, worker_command in enumerate(commands):
                    workers.append(
                        processes.start(
                            worker_command,
                            engine=engine,
                            name=f"{engine}-{number}",
                            url=url,
                            logs=Path(logs),
                            record=None,
                        )
                    )
                at_start = wait_blocked(workers, monitor)
                start_up_cpu = sum(processes.cpu_seconds(worker.pid) for worker in workers)
                transactions_before = monitor.transactions() if monitor else 0
                released_at = _database_now(conn, backend)
                _release_queue(conn, backend)
            released = time.perf_counter()
            peak = wait_exit(workers, monitor, settings.timeout, at_start)
            wall = time.perf_counter() - released
            worker_cpu = processes.children_cpu_seconds() - children_before - start_up_cpu
            transactions = None
            if monitor is not None:
                # Less the barrier's own transaction.
                transactions = monitor.settled_transactions() - transactions_before - 1
        finally:
            processes.stop_all(workers)
            queue.engine.dispose()
            if monitor is not None:
                monitor.close()
        window = _window(url, jobs, released_at)
    return Drain(
        jobs=jobs,
        window_seconds=window,
        wall_seconds=wall,
        worker_cpu_seconds=worker_cpu,
        connections=peak,
        transactions=transactions,
    )
