"""Reading jobs and requeueing dead ones.

A requeue never resurrects the dead row: it writes a NEW queued job and marks the dead one with
who, when and why, linked both ways. The idempotency key moves to the new job, so a later
enqueue with that key finds the live job.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, insert, select, update

from sqlqueue._errors import JobNotFound, JobStateError
from sqlqueue._job import Job
from sqlqueue._schema import jobs
from sqlqueue._store.rows import row_to_job
from sqlqueue.dialects import Dialect

__all__ = ["read_job", "requeue_dead"]


def read_job(conn: Connection, job_id: int) -> Job | None:
    """The job with ``job_id``, or ``None``."""
    row = conn.execute(select(jobs).where(jobs.c.id == job_id)).mappings().first()
    return row_to_job(row) if row is not None else None


def requeue_dead(conn: Connection, dialect: Dialect, *, job_id: int, by: str, reason: str) -> int:
    """Create a new queued job from dead job ``job_id``; return the new job's id."""
    query = dialect.lock_row(select(jobs).where(jobs.c.id == job_id))
    row = conn.execute(query).mappings().first()
    if row is None:
        raise JobNotFound(f"there is no job {job_id}")
    if row["status"] != "dead":
        raise JobStateError(f"job {job_id} is {row['status']}; only dead jobs can be requeued")
    if row["requeued_as"] is not None:
        raise JobStateError(f"job {job_id} was already requeued as job {row['requeued_as']}")
    current = dialect.now()
    # Free the key first: it is unique, and it belongs to the live job from now on.
    conn.execute(update(jobs).where(jobs.c.id == job_id).values(idempotency_key=None))
    new_row: dict[str, Any] = {
        "job_type": row["job_type"],
        "queue": row["queue"],
        "priority": row["priority"],
        "payload": row["payload"],
        "status": "queued",
        "attempts": 0,
        "max_attempts": row["max_attempts"],
        "errors": [],
        "idempotency_key": row["idempotency_key"],
        "group_key": row["group_key"],
        "requeued_from": job_id,
        "next_run_at": current,
        "created_at": current,
        "updated_at": current,
    }
    new_id = int(conn.execute(insert(jobs).values(**new_row).returning(jobs.c.id)).scalar_one())
    conn.execute(
        update(jobs)
        .where(jobs.c.id == job_id)
        .values(
            requeued_as=new_id,
            requeued_at=current,
            requeued_by=by,
            requeue_reason=reason,
            updated_at=current,
        )
    )
    return new_id
