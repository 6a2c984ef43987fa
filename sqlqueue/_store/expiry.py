"""Cancel waiting jobs past their expiry, recording reason ``expired``, a batch at a time.

The claim already skips such jobs (``sqlqueue/dialects/_claiming.py``), so this only moves
them to ``cancelled`` where operators and batches see them: every worker's upkeep runs it. The
rows are locked and skipped where another transaction holds them (a claim, another worker's
pass), and children of batches count in their batch in the same transaction.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection, bindparam, select, update

from sqlqueue._expiry import EXPIRED
from sqlqueue._schema import jobs
from sqlqueue._store.batches import Endings, settle
from sqlqueue._store.job_actions import Record, record_actions
from sqlqueue.dialects import Dialect

__all__ = ["expire_jobs"]

_WAITING = ("queued", "failed")

#: What an expiry writes down on each job it cancels.
_RECORD = Record(action="cancel", by="sqlqueue", reason=EXPIRED)


def expire_jobs(
    conn: Connection, dialect: Dialect, *, limit: int = 500, now: datetime | None = None
) -> int:
    """Cancel up to ``limit`` queued or failed jobs whose ``expires_at`` has passed by the
    database clock (or ``now``); return how many."""
    current = dialect.now(now)
    found = conn.execute(
        dialect.skip_locked(
            select(jobs.c.id, jobs.c.batch_id)
            .where(
                jobs.c.expires_at.is_not(None),
                jobs.c.expires_at <= current,
                jobs.c.status.in_(_WAITING),
            )
            .order_by(jobs.c.expires_at)
            .limit(limit)
        )
    ).all()
    if not found:
        return 0
    ids = [int(row[0]) for row in found]
    cancelled = dialect.execute_returning(
        conn,
        update(jobs)
        .where(jobs.c.id.in_(bindparam("ids", expanding=True)), jobs.c.status.in_(_WAITING))
        .values(status="cancelled", finished_at=current, updated_at=current)
        .returning(jobs.c.id, jobs.c.batch_id),
        {"ids": ids},
    ).all()
    endings = Endings()
    for job_id, batch_id in cancelled:
        if batch_id is not None:
            # With the job's id: a workflow step's expiry blocks or cancels the steps after it
            # under the workflow's ``on_dead``, as any cancel does.
            endings.ended(int(batch_id), "cancelled", job_id=int(job_id))
    if endings:
        settle(conn, dialect, endings)
    record_actions(conn, dialect, [int(row[0]) for row in cancelled], _RECORD)
    return len(cancelled)
