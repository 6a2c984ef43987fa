"""Reading jobs, and what a person does with dead ones: requeue or discard.

A requeue never resurrects the dead row: it writes a NEW queued job and marks the dead one with
who, when and why, linked both ways. The idempotency key moves to the new job, so a later
enqueue with that key finds the live job. The new job keeps the dead one's batch: a batch still
running takes back the dead child's ending and waits for the new job; a finished batch stays
finished (its counts and callback do not change). A discard marks the dead row handled without
running it. Acting on many jobs goes in batches, one short transaction each, taking only rows no
other transaction holds (PostgreSQL ``SKIP LOCKED``): two operators never act on the same dead
job. Each takes the counts' mark first and takes the jobs it handles off the error rollup
(sqlqueue/_store/error_counts.py), so the overview's top errors stay exact."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Select, bindparam, insert, select, update

from sqlqueue._errors import JobNotFound, JobStateError
from sqlqueue._job import Job
from sqlqueue._schema import jobs
from sqlqueue._store.batches import Endings, settle
from sqlqueue._store.counts import lock_for_handling
from sqlqueue._store.error_counts import forget_handled
from sqlqueue._store.filters import JobFilter, unhandled_dead
from sqlqueue._store.readable import moved_row
from sqlqueue._store.rows import row_to_job
from sqlqueue._store.tags import copy_tags, read_tags
from sqlqueue._store.workflows import replace_steps
from sqlqueue.dialects import Dialect

__all__ = [
    "discard_batch",
    "discard_one",
    "read_job",
    "requeue_batch",
    "requeue_one",
]


def read_job(conn: Connection, dialect: Dialect, job_id: int) -> Job | None:
    """The job with ``job_id``, or ``None``: the hot table first (one key lookup), then the
    history where there is one (an index lookup in each day's partition)."""
    row = conn.execute(select(jobs).where(jobs.c.id == job_id)).mappings().first()
    row = row if row is not None else moved_row(conn, dialect, job_id)
    if row is None:
        return None
    return replace(row_to_job(row), tags=read_tags(conn, [job_id]).get(job_id, ()))


def _locked_dead(
    conn: Connection, dialect: Dialect, job_filter: JobFilter, limit: int
) -> list[Any]:
    """Up to ``limit`` unhandled dead jobs matching the filter, oldest first, locked for this
    transaction; rows another transaction holds are skipped (it is acting on them)."""
    query: Select[Any] = (
        select(jobs)
        .where(*job_filter.clauses(), *unhandled_dead())
        .order_by(jobs.c.id)
        .limit(limit)
    )
    return list(conn.execute(dialect.skip_locked(query)).mappings())


def _locked_one_dead(conn: Connection, dialect: Dialect, job_id: int, action: str) -> Any:
    """Dead job ``job_id``, locked, or the error that says why it cannot be ``action``-ed:
    not dead, or handled already (requeued or discarded; the row lock makes two operators
    acting on it at once take turns, so the second is told what the first did)."""
    row = conn.execute(dialect.lock_row(select(jobs).where(jobs.c.id == job_id))).mappings().first()
    row = row if row is not None else moved_row(conn, dialect, job_id)
    if row is None:
        raise JobNotFound(f"there is no job {job_id}")
    if row["status"] != "dead":
        raise JobStateError(f"job {job_id} is {row['status']}; only dead jobs can be {action}")
    if row["requeued_as"] is not None:
        raise JobStateError(f"job {job_id} was already requeued as job {row['requeued_as']}")
    if row["discarded_at"] is not None:  # handled: a requeue now would run what was discarded
        already = "already " if action == "discarded" else ""
        raise JobStateError(
            f"job {job_id} was {already}discarded by {row['discarded_by']} "
            f"({row['discard_reason']})"
        )
    return row


def _requeue_rows(
    conn: Connection,
    dialect: Dialect,
    rows: Sequence[Any],
    *,
    mark: datetime,
    by: str,
    reason: str,
) -> list[int]:
    """New queued jobs from locked dead ``rows`` (same type, payload, options and tags); the
    dead rows record who, when and why, linked both ways. Idempotency keys move to the new
    jobs. ``mark``: the counts' mark, read under its lock (see :func:`lock_for_handling`)."""
    if not rows:
        return []
    current = dialect.now()
    dead_ids = [row["id"] for row in rows]
    forget_handled(conn, mark, dead_ids)
    # Free the keys first: they are unique, and belong to the live jobs from now on.
    keyed = [row["id"] for row in rows if row["idempotency_key"] is not None]
    if keyed:
        conn.execute(update(jobs).where(jobs.c.id.in_(keyed)).values(idempotency_key=None))
    # One multi-row INSERT; each new row names its dead row, so the order RETURNING gives the
    # ids in does not matter.
    insert_new = (
        insert(jobs)
        .values(
            status="queued",
            attempts=0,
            errors=[],
            next_run_at=current,
            created_at=current,
            updated_at=current,
        )
        .returning(jobs.c.requeued_from, jobs.c.id)
    )
    copied = [
        {
            "job_type": row["job_type"],
            "queue": row["queue"],
            "priority": row["priority"],
            "payload": row["payload"],
            "max_attempts": row["max_attempts"],
            "idempotency_key": row["idempotency_key"],
            "group_key": row["group_key"],
            "limit_key": row["limit_key"],
            # Its attempts stay in the trace of the request that enqueued the dead job.
            "trace_context": row["trace_context"],
            "batch_id": row["batch_id"],
            "requeued_from": row["id"],
        }
        for row in rows
    ]
    new_of: dict[int, int] = {
        int(dead): int(new) for dead, new in dialect.execute_returning(conn, insert_new, copied)
    }
    new_ids = [new_of[dead_id] for dead_id in dead_ids]
    mark_dead = (
        update(jobs)
        .where(jobs.c.id == bindparam("dead_id"))
        .values(
            requeued_as=bindparam("new_id"),
            requeued_at=current,
            requeued_by=by,
            requeue_reason=reason,
            updated_at=current,
        )
    )
    conn.execute(
        mark_dead, [{"dead_id": d, "new_id": n} for d, n in zip(dead_ids, new_ids, strict=True)]
    )
    copy_tags(dialect, conn, list(zip(dead_ids, new_ids, strict=True)))
    endings = Endings()
    for row in rows:  # a batch still running waits for the new job instead
        endings.ended(row["batch_id"], "dead", -1)
    if endings:
        settle(conn, dialect, endings)
    # A workflow's step: in a workflow not finished the new job takes the dead one's place
    # (its success releases the steps after it, as the dead one's would have); a finished
    # one stays as it finished, as a batch does, and the new job runs on its own. After
    # settle, which holds the workflows' rows: a step's row is locked after its workflow's,
    # as a worker round and a step added by a running step lock them, so none of them waits
    # on another crosswise.
    replace_steps(conn, dialect, list(zip(dead_ids, new_ids, strict=True)))
    return new_ids


def requeue_one(conn: Connection, dialect: Dialect, *, job_id: int, by: str, reason: str) -> int:
    """Requeue dead job ``job_id`` as a new job; return the new job's id."""
    mark = lock_for_handling(conn, dialect)
    row = _locked_one_dead(conn, dialect, job_id, "requeued")
    return _requeue_rows(conn, dialect, [row], mark=mark, by=by, reason=reason)[0]


def requeue_batch(
    conn: Connection, dialect: Dialect, job_filter: JobFilter, *, limit: int, by: str, reason: str
) -> list[int]:
    """Requeue up to ``limit`` matching unhandled dead jobs; return the new ids, oldest first."""
    mark = lock_for_handling(conn, dialect)
    rows = _locked_dead(conn, dialect, job_filter, limit)
    return _requeue_rows(conn, dialect, rows, mark=mark, by=by, reason=reason)


def _discard_values(dialect: Dialect, by: str, reason: str) -> dict[str, Any]:
    current = dialect.now()
    return {
        "discarded_at": current,
        "discarded_by": by,
        "discard_reason": reason,
        "updated_at": current,
    }


def discard_one(conn: Connection, dialect: Dialect, *, job_id: int, by: str, reason: str) -> Job:
    """Mark dead job ``job_id`` handled without running it; return it as it now is."""
    mark = lock_for_handling(conn, dialect)
    _locked_one_dead(conn, dialect, job_id, "discarded")
    forget_handled(conn, mark, [job_id])
    stmt = (
        update(jobs)
        .where(jobs.c.id == job_id)
        .values(**_discard_values(dialect, by, reason))
        .returning(*jobs.c)
    )
    return row_to_job(dialect.execute_returning(conn, stmt).mappings().one())


def discard_batch(
    conn: Connection, dialect: Dialect, job_filter: JobFilter, *, limit: int, by: str, reason: str
) -> list[int]:
    """Mark up to ``limit`` matching unhandled dead jobs handled; return their ids."""
    mark = lock_for_handling(conn, dialect)
    ids = [row["id"] for row in _locked_dead(conn, dialect, job_filter, limit)]
    if ids:
        forget_handled(conn, mark, ids)
        conn.execute(
            update(jobs).where(jobs.c.id.in_(ids)).values(**_discard_values(dialect, by, reason))
        )
    return ids
