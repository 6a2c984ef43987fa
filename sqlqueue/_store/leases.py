"""Leases: extend the ones a worker still holds (heartbeat), and give expired ones back (reap).

Both are fenced like every transition out of ``running``: a lease extension matches only rows
still running under the same worker and attempt, and a reap counts the attempt, so a late
worker can never overwrite what the reaper or another worker wrote.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, select, update

from sqlqueue._schema import jobs
from sqlqueue._store.batches import Endings, settle
from sqlqueue._store.outcomes import leased_by
from sqlqueue._store.rows import error_entry
from sqlqueue.dialects import Dialect

__all__ = ["LEASE_EXPIRED_KIND", "extend_leases", "reap_expired"]


#: Reaped jobs are retried at once: their worker is gone, not the job's fault.
LEASE_EXPIRED_KIND = "LeaseExpired"


def extend_leases(
    conn: Connection,
    dialect: Dialect,
    *,
    worker_id: str,
    fences: Sequence[tuple[int, int]],
    lease_seconds: float,
    now: datetime | None = None,
) -> dict[int, bool]:
    """Heartbeat: push the leases of running jobs forward. Returns the ids still ours, each
    mapped to whether someone asked for the job to be cancelled."""
    if not fences:
        return {}
    stmt = (
        update(jobs)
        .where(*leased_by(dialect, worker_id, fences))
        .values(lease_expires_at=dialect.now_plus(lease_seconds, now), updated_at=dialect.now(now))
        .returning(jobs.c.id, jobs.c.cancel_requested_at)
    )
    return {
        job_id: requested is not None for job_id, requested in dialect.execute_returning(conn, stmt)
    }


def reap_expired(
    conn: Connection, dialect: Dialect, *, limit: int, now: datetime | None = None
) -> tuple[list[int], list[int]]:
    """Return jobs whose lease expired to the queue (or to ``dead``); ``(retried, dead)`` ids.

    Safe to run in many workers at once: each row update is fenced on its expired lease and
    attempt, and PostgreSQL reapers skip rows another reaper holds. A child of a batch that
    goes to ``dead`` here counts in its batch, in this transaction.
    """
    current = dialect.now(now)
    query = dialect.skip_locked(
        select(
            jobs.c.id,
            jobs.c.attempts,
            jobs.c.max_attempts,
            jobs.c.errors,
            jobs.c.locked_by,
            jobs.c.lease_expires_at,
            jobs.c.batch_id,
            current.label("db_now"),
        )
        .where(jobs.c.status == "running", jobs.c.lease_expires_at < current)
        .order_by(jobs.c.lease_expires_at)
        .limit(limit)
    )
    retried: list[int] = []
    dead: list[int] = []
    endings = Endings()
    for row in conn.execute(query).mappings().all():
        message = (
            f"lease expired at {row['lease_expires_at'].isoformat()}: worker "
            f"{row['locked_by']} stopped heartbeating (crashed, killed or stalled)"
        )
        is_dead = row["attempts"] >= row["max_attempts"]
        entry = error_entry(
            attempt=row["attempts"], at=row["db_now"], error=message, kind=LEASE_EXPIRED_KIND
        )
        values: dict[str, Any] = {
            "status": "dead" if is_dead else "failed",
            "last_error": message,
            "errors": [*(row["errors"] or []), entry],
            "lease_expires_at": None,
            "updated_at": current,
        }
        if is_dead:
            values["finished_at"] = current
        else:
            values["next_run_at"] = current
        stmt = (
            update(jobs)
            .where(
                jobs.c.id == row["id"],
                jobs.c.status == "running",
                jobs.c.attempts == row["attempts"],
                jobs.c.lease_expires_at < current,
            )
            .values(**values)
        )
        if conn.execute(stmt).rowcount == 1:
            (dead if is_dead else retried).append(row["id"])
            if is_dead:
                endings.ended(row["batch_id"], "dead")
    if endings:
        settle(conn, dialect, endings, now)
    return retried, dead
