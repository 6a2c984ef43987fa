"""The outcomes of attempts: complete, fail (retry or dead), release, record starts and
progress.

Every transition out of ``running`` is fenced: it matches only rows still ``running`` under the
same lease (worker id and attempt number), so a late worker can never overwrite an outcome the
reaper or another worker has already written.

A transition that ends a job returns the job's ``batch_id`` with its id (no extra statement) and
notes the children of batches in the caller's :class:`~sqlqueue._store.batches.Endings`, which
the same transaction then settles.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, String, Update, bindparam, case, func, update
from sqlalchemy.sql.elements import ColumnElement

from sqlqueue._schema import jobs
from sqlqueue._store.batches import Endings
from sqlqueue._store.rows import Failure
from sqlqueue._store.statement_cache import cached_statement
from sqlqueue.dialects import Dialect, status_literal

__all__ = [
    "complete",
    "complete_statement",
    "fail",
    "fail_statement",
    "leased_by",
    "record_progress",
    "record_starts",
    "release",
]


def leased_by(
    dialect: Dialect, worker_id: str, fences: Sequence[tuple[int, int]]
) -> list[ColumnElement[bool]]:
    """The fence of a transition out of ``running``: the rows of ``fences`` (``(id, attempt)``)
    still running under ``worker_id``'s lease (the leases module fences with it too)."""
    return dialect.holds_lease(worker_id, list(fences))


def complete(
    conn: Connection,
    dialect: Dialect,
    *,
    worker_id: str,
    fences: Sequence[tuple[int, int]],
    results: Mapping[int, Any] | None = None,
    endings: Endings,
    now: datetime | None = None,
) -> set[int]:
    """Mark the leased jobs ``succeeded``; return the ids that were still ours, and note those
    in a batch in ``endings``.

    Jobs without a result share one statement; a job with a result (``results[id]``, not
    ``None``) gets its own, since each row stores a different value. ``conn`` may be a
    handler's own transaction, so the statements carry the tables' schema themselves.
    """
    results = results or {}
    plain = [fence for fence in fences if results.get(fence[0]) is None]
    landed: set[int] = set()
    if plain:
        stmt = complete_statement(dialect, now, with_result=False)
        params = {"worker_id": worker_id, **dialect.fence_parameters(plain)}
        options = dialect.table_options
        result = dialect.execute_returning(conn, stmt, params, execution_options=options)
        for job_id, batch_id in result.all():
            landed.add(job_id)
            if batch_id is not None:
                endings.ended(batch_id, "succeeded", job_id=job_id)
    for fence in fences:
        if results.get(fence[0]) is not None:
            stmt = complete_statement(dialect, now, with_result=True)
            params = {
                "worker_id": worker_id,
                "result": results[fence[0]],
                **dialect.fence_parameters([fence]),
            }
            options = dialect.table_options
            result = dialect.execute_returning(conn, stmt, params, execution_options=options)
            for job_id, batch_id in result.all():
                landed.add(job_id)
                endings.ended(batch_id, "succeeded", job_id=job_id)
    return landed


def complete_statement(dialect: Dialect, now: datetime | None, *, with_result: bool) -> Update:
    """The fenced move to ``succeeded`` for ``:fences`` of ``:worker_id`` (and ``:result``)."""
    if now is None:
        key = ("complete", type(dialect), with_result)
        return cached_statement(key, lambda: _build_complete(dialect, None, with_result))
    return _build_complete(dialect, now, with_result)


def _build_complete(dialect: Dialect, now: datetime | None, with_result: bool) -> Update:
    current = dialect.now(now)
    values: dict[str, Any] = {
        "status": status_literal("succeeded"),
        "started_at": _started(current),
        "finished_at": current,
        "updated_at": current,
        "lease_expires_at": None,
    }
    if with_result:
        values["result"] = bindparam("result", type_=jobs.c.result.type)
    return (
        update(jobs)
        .where(*dialect.holds_lease(bindparam("worker_id", type_=String())))
        .values(**values)
        .returning(jobs.c.id, jobs.c.batch_id)
    )


def _started(current: ColumnElement[Any]) -> ColumnElement[Any]:
    """``started_at`` of an attempt that ended: a job claimed ahead whose start was not yet
    recorded started at most a claim round before its outcome."""
    return func.coalesce(jobs.c.started_at, current)


def record_starts(
    conn: Connection,
    dialect: Dialect,
    *,
    worker_id: str,
    fences: Sequence[tuple[int, int]],
    now: datetime | None = None,
) -> None:
    """Record that jobs claimed ahead (``started_at`` NULL) have started: from now on a reaper
    counts their attempt, as it does for any job that ran."""
    current = dialect.now(now)
    conn.execute(
        update(jobs)
        .where(*leased_by(dialect, worker_id, fences), jobs.c.started_at.is_(None))
        .values(started_at=current, updated_at=current)
    )


def record_progress(
    conn: Connection,
    dialect: Dialect,
    *,
    worker_id: str,
    reports: Sequence[tuple[tuple[int, int], Mapping[str, Any]]],
    lease_seconds: float,
    now: datetime | None = None,
) -> set[int]:
    """Store each job's latest progress and extend its lease (progress is a heartbeat)."""
    landed: set[int] = set()
    for fence, progress in reports:
        stmt = (
            update(jobs)
            .where(*leased_by(dialect, worker_id, [fence]))
            .values(
                progress=dict(progress),
                lease_expires_at=dialect.now_plus(lease_seconds, now),
                updated_at=dialect.now(now),
            )
            .returning(jobs.c.id)
        )
        landed |= set(dialect.execute_returning(conn, stmt).scalars())
    return landed


def fail(
    conn: Connection,
    dialect: Dialect,
    *,
    worker_id: str,
    failure: Failure,
    endings: Endings,
    now: datetime | None = None,
) -> bool:
    """Record an attempt that did not succeed: ``failed`` with a retry time, ``dead``, or — for
    a snooze — back to ``queued`` without using up the attempt. A job whose cancellation was
    requested while it ran is ``cancelled`` instead of retried.

    Returns whether the lease was still ours (``False``: someone else owns the outcome); a
    child of a batch that ended (dead, cancelled) is noted in ``endings``.
    """
    stmt = fail_statement(dialect, worker_id=worker_id, failure=failure, now=now)
    row = dialect.execute_returning(conn, stmt).first()
    if row is None:
        return False
    endings.ended(row[1], row[0], job_id=failure.job_id)
    return True


def fail_statement(
    dialect: Dialect, *, worker_id: str, failure: Failure, now: datetime | None = None
) -> Update:
    """The fenced move of :func:`fail` for ``failure``: returns the row's new status and its
    ``batch_id``."""
    current = dialect.now(now)
    values: dict[str, Any] = {
        "updated_at": current,
        "lease_expires_at": None,
        "started_at": _started(current),
    }
    if failure.snooze:
        values["status"] = status_literal("queued")
        values["attempts"] = jobs.c.attempts - 1
        values["next_run_at"] = dialect.now_plus(failure.retry_in, now)
    else:
        values["last_error"] = failure.last_error
        values["errors"] = list(failure.errors)
    if failure.dead:
        values["status"] = status_literal("dead")
        values["finished_at"] = current
    elif not failure.snooze:
        cancelled = jobs.c.cancel_requested_at.is_not(None)
        values["status"] = case(
            (cancelled, status_literal("cancelled")), else_=status_literal("failed")
        )
        values["finished_at"] = case((cancelled, current), else_=None)
        values["next_run_at"] = dialect.now_plus(failure.retry_in, now)
    stmt = (
        update(jobs)
        .where(*leased_by(dialect, worker_id, [(failure.job_id, failure.attempt)]))
        .values(**values)
        .returning(jobs.c.status, jobs.c.batch_id)
    )
    return stmt


def release(
    conn: Connection,
    dialect: Dialect,
    *,
    worker_id: str,
    fences: Sequence[tuple[int, int]],
    now: datetime | None = None,
) -> set[int]:
    """Give leased jobs back to the queue without burning the attempt (graceful shutdown)."""
    if not fences:
        return set()
    current = dialect.now(now)
    stmt = (
        update(jobs)
        .where(*leased_by(dialect, worker_id, fences))
        .values(
            status=status_literal("queued"),
            attempts=jobs.c.attempts - 1,
            locked_by=None,
            lease_expires_at=None,
            next_run_at=current,
            updated_at=current,
        )
        .returning(jobs.c.id)
    )
    return set(dialect.execute_returning(conn, stmt).scalars())
