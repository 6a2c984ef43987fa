"""Faults injected from the test side into a worker process; sqlqueue itself is not changed.

Each hook wraps one sqlqueue internal in the worker process only, and is switched on by an
environment variable the test sets (read by :func:`install_from_environment`):

- ``FAULT_CLAIM_PAUSE=S``: every candidate row the claim's SELECT looks at costs S seconds
  (``fault_pause(S)`` in its WHERE clause), widening the window between a row being read as
  due and it being locked and updated — where a double claim would slip in;
- ``FAULT_RECORD_CLAIMS=1``: every non-empty claim notes its limit and row count;
- ``FAULT_NO_HEARTBEAT=1``: the worker never extends its leases (the reaper race test);
- ``FAULT_REAPER_INTERVAL=S``: the worker's reaper runs every S seconds instead of every half
  lease (``Queue.worker(reaper_interval=…)``, which the command line does not offer): a worker
  with a lease far longer than the test can still reap at once, and one whose reaper must not
  run during the test (an interval far longer than it) reaps nothing;
- ``FAULT_KILL_BEFORE_COMMIT=1``: a completion that includes a job enqueued with
  ``kill_commit=True`` terminates its own PostgreSQL connection after the UPDATE, before
  the COMMIT (once per job);
- ``FAULT_ENQUEUE_JOBS=N`` (see :func:`start_enqueuer`): the process also enqueues N jobs.

A hook that cannot find what it wraps raises at start-up, so a refactor of sqlqueue fails the
fault test loudly instead of silently testing nothing.
"""

from __future__ import annotations

import os
import random
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqlalchemy as sa

import sqlqueue
from sqlqueue._store import outcomes, store
from sqlqueue._worker import heartbeat
from sqlqueue.dialects import _base
from tests.apps.fault_ledger import record_claim, record_event
from tests.apps.fault_tasks import KILL_BEFORE_COMMIT

__all__ = ["install_from_environment", "start_enqueuer"]


def _wrap(owner: Any, name: str, make: Callable[[Any], Any]) -> None:
    original = getattr(owner, name, None)
    if original is None:
        raise RuntimeError(f"fault hook: {owner.__name__}.{name} is gone; update fault_hooks.py")
    setattr(owner, name, make(original))


def _sqlite_pause(seconds: float) -> int:
    time.sleep(seconds)
    return 1


def _widen_claim_window(seconds: float) -> None:
    def make(original: Any) -> Any:
        def due_jobs(self: Any, **options: Any) -> Any:
            return original(self, **options).where(sa.func.fault_pause(seconds))

        return due_jobs

    _wrap(_base.Dialect, "_due_jobs", make)

    def register(dbapi_connection: Any, _record: Any) -> None:
        create_function = getattr(dbapi_connection, "create_function", None)
        if create_function is not None:  # SQLite: PostgreSQL has the SQL function already
            create_function("fault_pause", 1, _sqlite_pause)

    sa.event.listen(sa.pool.Pool, "connect", register)


def _record(claims: list[tuple[int, int]]) -> None:
    """Ledger each landed claim's limit and size (after its commit: a ledger write inside the
    claim's transaction would wait for SQLite's write lock that transaction holds)."""
    for limit, returned in claims:
        if returned:
            try:
                record_claim(limit, returned)
            except Exception:  # the claim landed: a missing record fails the test instead
                traceback.print_exc()


def _record_claims() -> None:
    """Every claim goes through ``Store.cycle`` (``Store.claim`` is a cycle without outcomes)."""

    def make_cycle(original: Any) -> Any:
        def cycle(self: Any, **options: Any) -> Any:
            landed, claimed = original(self, **options)
            limits = [limit for _, limit in options["claims"]]
            _record([(limit, len(jobs)) for limit, jobs in zip(limits, claimed, strict=True)])
            return landed, claimed

        return cycle

    _wrap(store.Store, "cycle", make_cycle)


def _silence_heartbeats() -> None:
    def make(_original: Any) -> Any:
        def run_once(self: Any, jobs: Any, **_options: Any) -> set[int]:
            return set()

        return run_once

    _wrap(heartbeat.Heartbeat, "run_once", make)


def _reap_every(seconds: float) -> None:
    def make(original: Any) -> Any:
        def worker(self: Any, **options: Any) -> Any:
            options.setdefault("reaper_interval", seconds)
            return original(self, **options)

        return worker

    _wrap(sqlqueue.Queue, "worker", make)


def _kill_before_completion_commit() -> None:
    def make(original: Any) -> Any:
        def complete(conn: sa.Connection, *args: Any, **options: Any) -> Any:
            landed = original(conn, *args, **options)
            doomed = [job_id for job_id, _ in options["fences"] if job_id in KILL_BEFORE_COMMIT]
            if doomed:
                for job_id in doomed:
                    KILL_BEFORE_COMMIT.discard(job_id)
                    record_event("killed-before-commit", job_id)
                conn.exec_driver_sql("SELECT pg_terminate_backend(pg_backend_pid())")
            return landed

        return complete

    _wrap(outcomes, "complete", make)


def install_from_environment() -> list[str]:
    """Install the hooks the environment asks for; return their descriptions."""
    installed: list[str] = []
    pause = os.environ.get("FAULT_CLAIM_PAUSE")
    if pause:
        _widen_claim_window(float(pause))
        installed.append(f"claim select pauses {float(pause) * 1000:g} ms per candidate row")
    if os.environ.get("FAULT_RECORD_CLAIMS"):
        _record_claims()
        installed.append("claims recorded")
    if os.environ.get("FAULT_NO_HEARTBEAT"):
        _silence_heartbeats()
        installed.append("heartbeats off")
    reaper_interval = os.environ.get("FAULT_REAPER_INTERVAL")
    if reaper_interval:
        _reap_every(float(reaper_interval))
        installed.append(f"reaper every {float(reaper_interval):g} s")
    if os.environ.get("FAULT_KILL_BEFORE_COMMIT"):
        _kill_before_completion_commit()
        installed.append("connection killed before flagged completion commits")
    return installed


def start_enqueuer(queue: sqlqueue.Queue, jobs: int, *, start_file: str | None) -> None:
    """Enqueue ``jobs`` ``fault.noop`` jobs from a thread of this process, in transactions of
    1 to 5 jobs, once ``start_file`` exists; print the outcome (an error is the test's failure)."""

    def run() -> None:
        rng = random.Random(os.getpid())
        done = 0
        try:
            while start_file and not Path(start_file).exists():
                time.sleep(0.02)
            while done < jobs:
                batch = min(jobs - done, rng.randint(1, 5))
                with queue.engine.begin() as conn:
                    queue.enqueue_many(conn, [sqlqueue.JobRequest(job_type="fault.noop")] * batch)
                done += batch
                time.sleep(rng.uniform(0, 0.01))
            print(f"fault enqueuer: committed {done} jobs", flush=True)
        except BaseException:
            print(f"fault enqueuer: FAILED after {done} jobs", flush=True)
            traceback.print_exc()

    threading.Thread(target=run, name="fault-enqueuer", daemon=True).start()
