"""Making waiting jobs due now: an operator's "retry now", instead of waiting out the backoff
(and a test's drain, instead of waiting out a snooze)."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Connection, update

from sqlqueue._schema import jobs
from sqlqueue._store.filters import JobFilter
from sqlqueue.dialects import Dialect

__all__ = ["retry_now"]


def retry_now(
    conn: Connection,
    dialect: Dialect,
    job_filter: JobFilter,
    statuses: Sequence[str] = ("failed",),
) -> int:
    """Set ``next_run_at`` to now on every job in ``statuses`` (default: failed) matching
    ``job_filter`` whose next run is still in the future; return how many. The attempt count
    is left alone: a retry made due early is still the same retry."""
    current = dialect.now()
    stmt = (
        update(jobs)
        .where(*job_filter.clauses(), jobs.c.status.in_(statuses), jobs.c.next_run_at > current)
        .values(next_run_at=current, updated_at=current)
    )
    return conn.execute(stmt).rowcount
