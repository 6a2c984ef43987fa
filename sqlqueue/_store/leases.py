"""Leases: extend the ones a worker still holds (heartbeat), and give expired ones back (reap).

Both are fenced like every transition out of ``running``: a lease extension matches only rows
still running under the same worker and attempt, and a reap counts the attempt, so a late
worker can never overwrite what the reaper or another worker wrote. A job claimed ahead whose
start was never recorded (``started_at`` NULL: held for a slot, then its worker stopped and
could not release it) never ran: the reaper gives it back as a release would, attempt unused,
and notes it in the job's error history. A worker records such a start a moment after it (see
``RECORD_START_SECONDS`` in the worker loop), so a job that keeps killing its worker at once is
given its attempt back at most ``max_attempts`` times before the reaper counts them again.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Update, select, update
from sqlalchemy.sql.elements import ColumnElement

from sqlqueue._schema import jobs
from sqlqueue._store.batches import Endings, settle
from sqlqueue._store.outcomes import leased_by
from sqlqueue._store.rows import error_entry
from sqlqueue.dialects import Dialect, status_literal

__all__ = [
    "LEASE_EXPIRED_KIND",
    "NOT_STARTED_KIND",
    "extend_leases",
    "extend_statement",
    "reap_expired",
]


#: Reaped jobs are retried at once: their worker is gone, not the job's fault.
LEASE_EXPIRED_KIND = "LeaseExpired"
#: A reaped job that never started: its attempt is given back.
NOT_STARTED_KIND = "NotStarted"


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
    stmt = extend_statement(
        dialect, worker_id=worker_id, fences=fences, lease_seconds=lease_seconds, now=now
    )
    return {
        job_id: requested is not None for job_id, requested in dialect.execute_returning(conn, stmt)
    }


def extend_statement(
    dialect: Dialect,
    *,
    worker_id: str,
    fences: Sequence[tuple[int, int]],
    lease_seconds: float,
    now: datetime | None = None,
) -> Update:
    """The heartbeat's fenced lease extension for ``fences``: returns each job's id and
    ``cancel_requested_at``."""
    return (
        update(jobs)
        .where(*leased_by(dialect, worker_id, fences))
        .values(lease_expires_at=dialect.now_plus(lease_seconds, now), updated_at=dialect.now(now))
        .returning(jobs.c.id, jobs.c.cancel_requested_at)
    )


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
            jobs.c.started_at,
            current.label("db_now"),
        )
        .where(jobs.c.status == status_literal("running"), jobs.c.lease_expires_at < current)
        .order_by(jobs.c.lease_expires_at)
        .limit(limit)
    )
    retried: list[int] = []
    dead: list[int] = []
    endings = Endings()
    for row in conn.execute(query).mappings().all():
        fence = (
            jobs.c.id == row["id"],
            jobs.c.status == status_literal("running"),
            jobs.c.attempts == row["attempts"],
            jobs.c.lease_expires_at < current,
        )
        history = row["errors"] or []
        if row["started_at"] is None and _not_started(history) < row["max_attempts"]:
            # Claimed ahead and never started: not an attempt.
            entry = error_entry(
                attempt=row["attempts"],
                at=row["db_now"],
                error=(
                    f"lease expired at {row['lease_expires_at'].isoformat()} before the job "
                    f"started: worker {row['locked_by']} had claimed it ahead of a free slot and "
                    "stopped without giving it back; the attempt is not counted"
                ),
                kind=NOT_STARTED_KIND,
            )
            if conn.execute(_unused(fence, current, [*history, entry])).rowcount == 1:
                retried.append(row["id"])
            continue
        message = (
            f"lease expired at {row['lease_expires_at'].isoformat()}: worker "
            f"{row['locked_by']} stopped heartbeating (crashed, killed or stalled)"
        )
        is_dead = row["attempts"] >= row["max_attempts"]
        entry = error_entry(
            attempt=row["attempts"], at=row["db_now"], error=message, kind=LEASE_EXPIRED_KIND
        )
        values: dict[str, Any] = {
            "status": status_literal("dead" if is_dead else "failed"),
            "last_error": message,
            "errors": [*history, entry],
            "lease_expires_at": None,
            "updated_at": current,
        }
        if is_dead:
            values["finished_at"] = current
        else:
            values["next_run_at"] = current
        stmt = update(jobs).where(*fence).values(**values)
        if conn.execute(stmt).rowcount == 1:
            (dead if is_dead else retried).append(row["id"])
            if is_dead:
                endings.ended(row["batch_id"], "dead", job_id=row["id"])
    if endings:
        settle(conn, dialect, endings, now)
    return retried, dead


def _not_started(history: Sequence[Any]) -> int:
    """How many times a job's attempt was given back because it never started."""
    return sum(1 for entry in history if entry.get("kind") == NOT_STARTED_KIND)


def _unused(
    fence: tuple[ColumnElement[bool], ...], current: ColumnElement[Any], errors: list[Any]
) -> Update:
    """Back to ``queued``, due now and with its attempt given back: what the worker's release
    would have written (the row's ``started_at`` must still be NULL), plus ``errors``."""
    return (
        update(jobs)
        .where(*fence, jobs.c.started_at.is_(None))
        .values(
            status=status_literal("queued"),
            attempts=jobs.c.attempts - 1,
            errors=errors,
            locked_by=None,
            lease_expires_at=None,
            next_run_at=current,
            updated_at=current,
        )
    )
