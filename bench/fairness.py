"""``python -m bench --only fairness``: concurrency limits, measured (issue 24).

1. **Fairness**: one tenant enqueues ``--fairness-big`` jobs (20,000), then ten tenants enqueue
   10 each, while 2 worker processes x 16 slots (started first) drain them, each job a 5 ms
   sleep. Reported: the p50
   and p99 wait (start minus enqueue, database clock) of the small tenants' jobs, without a limit
   and with ``Concurrency(limit=2, key=tenant)``, on each backend of ``--backends``.
2. **Claim latency** (PostgreSQL): ``--fairness-keys`` keys (1,000) each at its limit (2 jobs
   running) and ``--fairness-due`` due jobs (100,000) behind them; the p50/p99 of a worker's
   claim (16 slots), timed around ``Store.claim``, and the EXPLAIN ANALYZE of the statement that
   finds keys with room.

The machine may be shared: compare the two fairness figures of one run, not across runs.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence

import sqlalchemy as sa

import sqlqueue
from bench.databases import ROOT, fresh_database
from bench.names import TENANT_JOB as TASK
from bench.settings import Settings
from sqlqueue._schema import jobs
from sqlqueue._store.key_walk import WALK_KEYS, candidate_keys_query
from sqlqueue._store.limited_claim import ClaimLimits

__all__ = ["run"]

_SMALL_TENANTS, _SMALL_JOBS = 10, 10


def run(settings: Settings, *, big: int, keys: int, due: int) -> int:
    """Both parts; print the figures; 0 when done."""
    for backend in settings.backends:
        for limit in (0, 2):
            p50, p99, seconds = _fairness(settings, backend, big=big, limit=limit)
            label = f"limit {limit} per tenant" if limit else "no limit"
            print(
                f"fairness [{backend}] {big:,} big-tenant jobs then {_SMALL_TENANTS}x"
                f"{_SMALL_JOBS}, 2 workers x 16, {label}: small tenants' wait p50 {p50:.3f} s, "
                f"p99 {p99:.3f} s (all started {seconds:.1f} s after the first enqueue)",
                flush=True,
            )
    if "postgresql" in settings.backends:
        _claim_latency(settings, keys=keys, due=due)
    return 0


def _fairness(
    settings: Settings, backend: str, *, big: int, limit: int
) -> tuple[float, float, float]:
    with fresh_database(backend, settings.target) as url:
        engine = sa.create_engine(url)
        queue = sqlqueue.Queue(engine)
        concurrency = (
            sqlqueue.Concurrency(limit=limit, key=lambda p: str(p["tenant"])) if limit else None
        )
        queue.task(TASK, concurrency=concurrency)(lambda **_: None)
        env = {
            **os.environ,
            "SQLQUEUE_DATABASE_URL": url,
            "SQLQUEUE_BENCH_TENANT_LIMIT": str(limit),
        }
        command = [
            sys.executable,
            "-m",
            "sqlqueue",
            "worker",
            "bench.fairness_app:queue",
            "--concurrency",
            "16",
            "--poll-interval",
            "0.05",
        ]
        workers = [
            subprocess.Popen(
                command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            for _ in range(2)
        ]
        try:
            _wait_for_workers(queue, len(workers))
            started = time.monotonic()
            with engine.begin() as conn:
                queue.enqueue_many(
                    conn,
                    [
                        sqlqueue.JobRequest(job_type=TASK, payload={"tenant": "big", "n": n})
                        for n in range(big)
                    ],
                )
            with engine.begin() as conn:
                small = queue.enqueue_many(
                    conn,
                    [
                        sqlqueue.JobRequest(job_type=TASK, payload={"tenant": f"t{t}", "n": n})
                        for n in range(_SMALL_JOBS)
                        for t in range(_SMALL_TENANTS)
                    ],
                )
            waits = _wait_for_starts(engine, small)
        finally:
            for worker in workers:
                worker.terminate()
            for worker in workers:
                try:
                    worker.wait(60)
                except subprocess.TimeoutExpired:
                    worker.kill()
        seconds = time.monotonic() - started
        engine.dispose()
    waits.sort()
    return statistics.median(waits), waits[int(len(waits) * 0.99) - 1], seconds


def _wait_for_workers(queue: sqlqueue.Queue, count: int) -> None:
    """Wait (up to 5 minutes) until ``count`` workers are up: the waits measured are the
    queue's, not the workers' start-up."""
    deadline = time.monotonic() + 300
    while len(queue.workers()) < count:
        if time.monotonic() > deadline:
            raise SystemExit("fairness: the workers did not start within 5 minutes")
        time.sleep(0.2)


def _wait_for_starts(engine: sa.Engine, ids: Sequence[int]) -> list[float]:
    """Wait (up to 15 minutes) until every job of ``ids`` started; their waits in seconds."""
    query = sa.select(jobs.c.created_at, jobs.c.started_at).where(jobs.c.id.in_(list(ids)))
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        with engine.connect() as conn:
            rows = conn.execute(query).all()
        if all(started is not None for _, started in rows):
            return [(started - created).total_seconds() for created, started in rows]
        time.sleep(0.2)
    raise SystemExit("fairness: the small tenants' jobs did not all start within 15 minutes")


def _claim_latency(settings: Settings, *, keys: int, due: int) -> None:
    with fresh_database("postgresql", settings.target) as url:
        engine = sa.create_engine(url)
        queue = sqlqueue.Queue(engine)
        queue.task(TASK, concurrency=sqlqueue.Concurrency(limit=2, key=lambda p: p["tenant"]))(
            lambda **_: None
        )
        common = (
            "job_type, queue, priority, payload, attempts, max_attempts, next_run_at, errors, "
            "created_at, updated_at, limit_key"
        )
        with engine.begin() as conn:
            # Two running jobs per key (each key at its limit), then the due jobs behind them.
            conn.exec_driver_sql(
                f"INSERT INTO sqlqueue_jobs ({common}, status, locked_by, lease_expires_at) "
                "SELECT %(task)s, 'default', 0, '{}', 1, 8, now(), '[]', now(), now(), "
                "'k' || (g %% %(keys)s), 'running', 'bench', now() + interval '1 day' "
                "FROM generate_series(1, %(running)s) g",
                {"task": TASK, "keys": keys, "running": 2 * keys},
            )
            conn.exec_driver_sql(
                f"INSERT INTO sqlqueue_jobs ({common}, status) "
                "SELECT %(task)s, 'default', 0, '{}', 0, 8, now() - interval '1 minute', '[]', "
                "now(), now(), 'k' || (g %% %(keys)s), 'queued' "
                "FROM generate_series(1, %(due)s) g",
                {"task": TASK, "keys": keys, "due": due},
            )
            conn.exec_driver_sql("ANALYZE sqlqueue_jobs")
        timings = []
        limits = ClaimLimits(tasks={TASK: 2})  # what a worker of this queue obeys
        for _ in range(300):
            began = time.perf_counter()
            claimed = queue.store.claim(
                queues=["default"],
                job_types=None,
                limit=16,
                worker_id="bench",
                lease_seconds=30,
                limits=limits,
            )
            timings.append(time.perf_counter() - began)
            assert claimed == [], "every key is at its limit: nothing may be claimed"
        timings.sort()
        print(
            f"claim latency [postgresql] {keys:,} keys at their limit, {due:,} due jobs behind "
            f"them, limit 16: p50 {statistics.median(timings) * 1000:.2f} ms, p99 "
            f"{timings[int(len(timings) * 0.99) - 1] * 1000:.2f} ms",
            flush=True,
        )
        query = candidate_keys_query(queue.dialect, TASK, 2, ["default"], WALK_KEYS)
        compiled = query.compile(engine, compile_kwargs={"literal_binds": True})
        with engine.connect() as conn:
            plan = conn.exec_driver_sql(f"EXPLAIN (ANALYZE, BUFFERS) {compiled}").scalars().all()
        print(f"plan of the statement that looks for keys with room (up to {WALK_KEYS} keys):")
        print("\n".join(f"    {line}" for line in plan))
        engine.dispose()
