"""Putting jobs in, running them, and reading them back, the same way in every test."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa

import sqlqueue
from sqlqueue._schema import jobs
from sqlqueue.dialects import dialect_for

__all__ = ["count_jobs", "db_now", "drain", "enqueue"]


def drain(queue: sqlqueue.Queue, **options: object) -> None:
    """Run a burst worker with a fast poll until no job is due and none runs."""
    options.setdefault("poll_interval", 0.02)
    queue.worker(**options).run(burst=True)  # type: ignore[arg-type]


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
