"""Putting jobs in, running them, and reading them back, the same way in every test."""

from __future__ import annotations

import threading
from datetime import datetime
from typing import Any

import sqlalchemy as sa

import sqlqueue
from sqlqueue._schema import jobs
from sqlqueue.dialects import dialect_for
from tests._support.waiting import DEADLINE_SECONDS

__all__ = ["count_jobs", "db_now", "drain", "enqueue"]


def drain(queue: sqlqueue.Queue, *, deadline: float = DEADLINE_SECONDS, **options: object) -> None:
    """Run a burst worker with a fast poll, in the calling thread, until no job is due and none
    runs; if it still finds work after ``deadline`` seconds, stop it and fail the test, naming
    the jobs still waiting."""
    options.setdefault("poll_interval", 0.02)
    worker = queue.worker(**options)  # type: ignore[arg-type]
    late = threading.Event()

    def stop() -> None:
        late.set()
        worker.stop()

    watchdog = threading.Timer(deadline, stop)
    watchdog.daemon = True
    watchdog.start()
    try:
        worker.run(burst=True)
    finally:
        watchdog.cancel()
    if late.is_set():
        raise AssertionError(
            f"a burst worker draining the queue still found work after {deadline:.0f} s; "
            f"jobs not finished: {_unfinished(queue)}"
        )


def _unfinished(queue: sqlqueue.Queue) -> str:
    """The jobs still queued, running or failed, briefly (for a deadline's message)."""
    waiting = [
        job
        for status in ("queued", "running", "failed")
        for job in queue.jobs(status=status, limit=20)
    ]
    shown = ", ".join(f"{job.id} {job.job_type} ({job.status})" for job in waiting[:20])
    return f"{len(waiting)}{'+' if len(waiting) >= 20 else ''}: {shown or 'none'}"


def enqueue(queue: sqlqueue.Queue, job_type: str, count: int = 1, **payload: Any) -> list[int]:
    """Enqueue ``count`` jobs of ``job_type`` in one committed transaction, payloads
    ``{"n": i, **payload}`` for i in 0..count-1; return their ids in order."""
    requests = [
        sqlqueue.JobRequest(job_type=job_type, payload={"n": i, **payload}) for i in range(count)
    ]
    with queue.engine.begin() as conn:
        return queue.enqueue_many(conn, requests)


def db_now(engine: sa.Engine) -> datetime:
    """The database clock, the same expression sqlqueue uses."""
    with engine.connect() as conn:
        value = conn.execute(sa.select(dialect_for(engine).clock())).scalar_one()
    assert isinstance(value, datetime)
    return value


def count_jobs(engine: sa.Engine, **where: object) -> int:
    """How many job rows match ``column=value`` filters."""
    query = sa.select(sa.func.count()).select_from(jobs)
    for column, value in where.items():
        query = query.where(jobs.c[column] == value)
    with engine.connect() as conn:
        return int(conn.execute(query).scalar_one())
