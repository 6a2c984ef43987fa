"""Cancelling jobs: queued and failed ones at once, running ones by asking their handler.

A running job is never yanked from its worker: ``cancel_requested_at`` is set, the worker's
heartbeat notices it and turns the handler's ``ctx.cancelled`` on, and if the attempt then fails
the job ends ``cancelled`` instead of being retried. A child of a batch cancelled here counts
in its batch in the same transaction.

A workflow step still ``waiting`` is locked after its workflow's row, as the release of it
locks it (the lock order of :mod:`sqlqueue._store.batches`); any other job's row first. The
one exception to that order is here: a step released while the cancel waits for its workflow,
then claimed, run and finished at once, can deadlock the cancel with the worker's round; the
batches module says which side the server aborts and why neither loses an outcome.
"""

from __future__ import annotations

from sqlalchemy import Connection, select, update

from sqlqueue._errors import JobNotFound, JobStateError
from sqlqueue._job import Job
from sqlqueue._schema import jobs
from sqlqueue._store.batches import Endings, hold_batches, settle
from sqlqueue._store.job_actions import Record, record_actions
from sqlqueue._store.readable import moved_row
from sqlqueue._store.rows import row_to_job
from sqlqueue.dialects import Dialect

__all__ = ["cancel_job"]

_WAITING = ("queued", "failed", "waiting")


def cancel_job(
    conn: Connection, dialect: Dialect, job_id: int, record: Record | None = None
) -> Job:
    """Cancel one job (or ask its handler to stop, if it runs); return it as it now is.
    ``record``: who asked and why, written down in the same transaction."""
    # Unlocked: a waiting step is released only under its workflow's row, so the cancel takes
    # that row before the step's; any other job's row is taken first, as a claim takes it.
    seen = conn.execute(select(jobs.c.status, jobs.c.batch_id).where(jobs.c.id == job_id)).first()
    if seen is not None and seen[0] == "waiting" and seen[1] is not None:
        hold_batches(conn, dialect, [int(seen[1])])
    row = conn.execute(dialect.lock_row(select(jobs).where(jobs.c.id == job_id))).mappings().first()
    row = row if row is not None else moved_row(conn, dialect, job_id)
    if row is None:
        raise JobNotFound(f"there is no job {job_id}")
    current = dialect.now()
    if row["status"] in _WAITING:
        values = {"status": "cancelled", "finished_at": current, "updated_at": current}
    elif row["status"] == "running":
        values = {"cancel_requested_at": current, "updated_at": current}
    else:
        raise JobStateError(
            f"job {job_id} is {row['status']}; only queued, failed, waiting or running jobs can "
            "be cancelled"
        )
    updated = (
        dialect.execute_returning(
            conn,
            update(jobs)
            .where(jobs.c.id == job_id, jobs.c.status == row["status"])
            .values(**values)
            .returning(*jobs.c),
        )
        .mappings()
        .one()
    )
    if updated["status"] == "cancelled" and updated["batch_id"] is not None:
        endings = Endings()
        endings.ended(updated["batch_id"], "cancelled", job_id=job_id)
        settle(conn, dialect, endings)
    record_actions(conn, dialect, [job_id], record)
    return row_to_job(updated)
