"""Maintenance writes: retention (pruning finished jobs), the lease on a one-at-a-time duty,
and pausing queues.

Pruning goes in batches, one short transaction each, and takes only rows no other transaction
holds (PostgreSQL ``SKIP LOCKED``): it never locks the table, and two pruners never delete the
same row.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, bindparam, delete, select, update

from sqlqueue._schema import batches as batch_rows
from sqlqueue._schema import duties, job_actions, job_tags, jobs, jobs_history, queues
from sqlqueue._store import batches, counts, error_counts
from sqlqueue._types import UtcDateTime
from sqlqueue.dialects import Dialect

__all__ = [
    "PAUSES_CHANGED",
    "pause_queue",
    "prune_batch",
    "release_duty",
    "resume_queue",
    "take_duty",
]


def prune_batch(
    conn: Connection,
    dialect: Dialect,
    *,
    status: str,
    older_than: float,
    limit: int,
    now: datetime | None = None,
) -> int:
    """Delete up to ``limit`` jobs of a finished ``status`` that finished more than
    ``older_than`` seconds ago (database clock); return how many went. The rows of finished
    batches whose last job went with them go too (see :func:`batches.forget_finished`), and
    so do the operators' actions recorded on the jobs and their tags.

    One DELETE picks and deletes the oldest jobs (where the dialect allows its subquery) and
    returns, per job, whether the counts' rollup had counted it rather than its finishing
    time: shipping a thousand ids back and forth, and parsing a thousand timestamps, cost a
    batch as much as the deletion itself (``bench/operations.py``, the first prune)."""
    cutoff = dialect.now_plus(-float(older_than), now)
    mark = counts.lock_for_prune(conn, dialect)
    chosen = dialect.skip_locked(
        select(jobs.c.id)
        .where(jobs.c.status == status, jobs.c.finished_at < cutoff, ~_in_running_workflow())
        .order_by(jobs.c.finished_at)
        .limit(limit)
    )
    params: dict[str, Any] = {"mark": mark}
    if dialect.deletes_by_limited_subquery and status != "dead":
        target = jobs.c.id.in_(chosen.scalar_subquery())
    else:
        params["ids"] = list(conn.execute(chosen).scalars())
        if not params["ids"]:
            return 0
        target = jobs.c.id.in_(bindparam("ids", expanding=True))
        # Dead jobs' errors come off the error rollup, read before they go: SQLite 3.40's
        # DELETE … RETURNING gave NULL for a column its covering index lacks (last_error).
        error_counts.forget_handled(conn, mark, params["ids"])
    stmt = delete(jobs).where(target).returning(*_RETURNED)
    gone = dialect.execute_returning(conn, stmt, params).all()
    if not gone:
        return 0
    counts.prune_counted(conn, dialect, [row[1:5] for row in gone])
    batches.forget_finished(conn, dialect, [row[5] for row in gone])
    ids = [row[0] for row in gone]
    conn.execute(_orphan_actions(dialect), {"low": min(ids), "high": max(ids)})
    conn.execute(delete(job_tags).where(job_tags.c.job_id.in_(ids)))
    return len(gone)


#: What deleting a job returns: its id, its count key, whether it finished before the counts'
#: mark (so the rollup counted it), and its batch.
_RETURNED = (
    jobs.c.id,
    jobs.c.status,
    jobs.c.queue,
    jobs.c.job_type,
    (jobs.c.finished_at < bindparam("mark", type_=UtcDateTime())).label("counted"),
    jobs.c.batch_id,
)
#: The operators' actions of jobs that are gone, among job ids ``low`` to ``high``: those of
#: the jobs a batch deleted (an index range, not a thousand ids sent back).
_DELETE_ORPHAN_ACTIONS = delete(job_actions).where(
    job_actions.c.job_id.between(bindparam("low"), bindparam("high")),
    ~select(jobs.c.id).where(jobs.c.id == job_actions.c.job_id).exists(),
)
#: The same where jobs move into the history: a job in that id range may live there now, and
#: its actions stay until its day is dropped.
_DELETE_ORPHAN_ACTIONS_MOVED = _DELETE_ORPHAN_ACTIONS.where(
    ~select(jobs_history.c.id).where(jobs_history.c.id == job_actions.c.job_id).exists()
)


def _orphan_actions(dialect: Dialect) -> Any:
    """The statement that deletes a prune batch's orphaned actions on ``dialect``."""
    if dialect.supports_history_partitions:
        return _DELETE_ORPHAN_ACTIONS_MOVED
    return _DELETE_ORPHAN_ACTIONS


def _in_running_workflow() -> Any:
    """A job that is a step of a workflow not yet finished: kept, since the steps after it
    read its result (``ctx.upstream_results``) and its row holds the workflow's history."""
    return (
        select(batch_rows.c.id)
        .where(
            batch_rows.c.id == jobs.c.batch_id,
            batch_rows.c.finished_at.is_(None),
            batch_rows.c.workflow_on_dead.is_not(None),
        )
        .exists()
    )


def take_duty(
    conn: Connection, dialect: Dialect, *, name: str, holder: str, seconds: float
) -> bool:
    """Hold duty ``name`` for ``seconds`` more if it is free, expired or already ours: one worker
    at a time across every host performs it. Returns whether ``holder`` has it now."""
    until = dialect.now_plus(seconds)
    stmt = dialect.upsert(
        duties,
        values={"name": name, "holder": holder, "expires_at": until},
        conflict=["name"],
        set_={"holder": holder, "expires_at": until},
        where=(duties.c.expires_at < dialect.clock()) | (duties.c.holder == holder),
    ).returning(duties.c.holder)
    return dialect.execute_returning(conn, stmt).first() is not None


def release_duty(conn: Connection, *, name: str, holder: str) -> None:
    """Give up duty ``name`` if ``holder`` has it, so another worker can take it at once."""
    conn.execute(delete(duties).where(duties.c.name == name, duties.c.holder == holder))


def pause_queue(conn: Connection, dialect: Dialect, *, name: str, by: str, reason: str) -> None:
    """Mark queue ``name`` paused (again, if it was), with who and why."""
    current = dialect.now()
    values = {"paused_at": current, "paused_by": by, "pause_reason": reason, "updated_at": current}
    dialect.execute_returning(
        conn,
        dialect.upsert(
            queues,
            values={"name": name, **values},
            conflict=["name"],
            set_=values,
            where=queues.c.name == name,
        ),
    )
    _announce(conn, dialect)


def resume_queue(conn: Connection, dialect: Dialect, *, name: str) -> bool:
    """Let workers claim from queue ``name`` again; return whether it was paused."""
    stmt = (
        update(queues)
        .where(queues.c.name == name, queues.c.paused_at.is_not(None))
        .values(paused_at=None, updated_at=dialect.now())
    )
    resumed = conn.execute(stmt).rowcount > 0
    _announce(conn, dialect)
    return resumed


def set_queue_limit(conn: Connection, dialect: Dialect, *, name: str, limit: int | None) -> None:
    """Let at most ``limit`` jobs of queue ``name`` run at once (``None``: no limit)."""
    current = dialect.now()
    values = {"max_running": limit, "updated_at": current}
    dialect.execute_returning(
        conn,
        dialect.upsert(
            queues,
            values={"name": name, **values},
            conflict=["name"],
            set_=values,
            where=queues.c.name == name,
        ),
    )
    _announce(conn, dialect)


#: The wake-up payload that tells listening workers to re-read which queues are paused.
PAUSES_CHANGED = "sqlqueue:pauses-changed"


def _announce(conn: Connection, dialect: Dialect) -> None:
    """Wake listening workers (on commit) to re-read the paused queues now, not at their next
    poll."""
    stmt = dialect.notify_statement(PAUSES_CHANGED)
    if stmt is not None:
        conn.execute(stmt)
