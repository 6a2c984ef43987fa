"""Moving jobs back in time, for tests (:func:`sqlqueue.testing.age_jobs`): every time a job row
holds goes back by the same amount, as if all of it had happened that much earlier.

The times are read, moved in Python and written back with bound values, one statement for all
rows: no database needs interval arithmetic on a column for it. A finished job moved back may
land below the finished-counts rollup's mark; the rollup is then forgotten (stats count live
until the next fold), so stats stay exact.
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import Connection, bindparam, select, update
from sqlalchemy.sql.elements import ColumnElement

from sqlqueue._schema import jobs
from sqlqueue._store.counts import FINISHED, reset_counts

__all__ = ["TIMES", "age_jobs"]

#: Every time a job row holds, all moved together.
TIMES = (
    "created_at",
    "updated_at",
    "next_run_at",
    "started_at",
    "finished_at",
    "lease_expires_at",
    "cancel_requested_at",
    "requeued_at",
    "discarded_at",
)


def age_jobs(conn: Connection, where: list[ColumnElement[bool]], by: timedelta) -> int:
    """Move every time of the jobs matching ``where`` back by ``by``; return how many moved."""
    rows = conn.execute(
        select(jobs.c.id, jobs.c.status, *(jobs.c[name] for name in TIMES))
        .where(*where)
        .order_by(jobs.c.id)
    ).all()
    if not rows:
        return 0
    statement = (
        update(jobs)
        .where(jobs.c.id == bindparam("aged_id"))
        .values({name: bindparam(f"aged_{name}", type_=jobs.c[name].type) for name in TIMES})
    )
    conn.execute(
        statement,
        [
            {
                "aged_id": row.id,
                **{
                    f"aged_{name}": None if getattr(row, name) is None else getattr(row, name) - by
                    for name in TIMES
                },
            }
            for row in rows
        ],
    )
    if any(row.status in FINISHED for row in rows):
        reset_counts(conn)
    return len(rows)
