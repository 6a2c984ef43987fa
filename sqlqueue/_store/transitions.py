"""The worker's statements: claim, complete, fail, release, extend leases, reap.

Every transition out of ``running`` is fenced: it matches only rows still ``running`` under the
same lease (worker id and attempt number), so a late worker can never overwrite an outcome the
reaper or another worker has already written.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar, cast

from sqlalchemy import Connection, String, Update, bindparam, case, select, update
from sqlalchemy.sql.elements import ColumnElement

from sqlqueue._schema import jobs
from sqlqueue._store.rows import ClaimedJob, Failure, claims_from_rows, error_entry
from sqlqueue.dialects import Dialect

__all__ = [
    "claim",
    "complete",
    "extend_leases",
    "fail",
    "reap_expired",
    "record_progress",
    "release",
]

T = TypeVar("T")

#: Reaped jobs are retried at once: their worker is gone, not the job's fault.
LEASE_EXPIRED_KIND = "LeaseExpired"


def _leased_by(
    dialect: Dialect, worker_id: str, fences: Sequence[tuple[int, int]]
) -> list[ColumnElement[bool]]:
    return dialect.holds_lease(worker_id, list(fences))


def claim(
    conn: Connection,
    dialect: Dialect,
    *,
    queues: Sequence[str],
    job_types: Sequence[str] | None,
    limit: int,
    worker_id: str,
    lease_seconds: float,
    now: datetime | None = None,
) -> list[ClaimedJob]:
    """Lease up to ``limit`` due jobs to ``worker_id``, most urgent first."""
    if now is None:
        key = (
            "claim",
            type(dialect),
            tuple(queues),
            None if job_types is None else tuple(job_types),
        )
        stmt = _cached(
            key,
            lambda: dialect.claim_statement(
                queues=queues, job_types=job_types, lease_seconds=lease_seconds, now=None
            ),
        )
    else:
        stmt = dialect.claim_statement(
            queues=queues, job_types=job_types, lease_seconds=lease_seconds, now=now
        )
    params = {"claim_limit": limit, "worker_id": worker_id, "lease_seconds": float(lease_seconds)}
    claimed = claims_from_rows(
        dialect.execute_returning(conn, stmt, params).all(),
        moment=dialect.claim_moment,
        document=_json_decoder(conn),
    )
    claimed.sort(key=lambda job: (job.priority, job.id))
    return claimed


def complete(
    conn: Connection,
    dialect: Dialect,
    *,
    worker_id: str,
    fences: Sequence[tuple[int, int]],
    results: Mapping[int, Any] | None = None,
    now: datetime | None = None,
) -> set[int]:
    """Mark the leased jobs ``succeeded``; return the ids that were still ours.

    Jobs without a result share one statement; a job with a result (``results[id]``, not
    ``None``) gets its own, since each row stores a different value. ``conn`` may be a
    handler's own transaction, so the statements carry the tables' schema themselves.
    """
    results = results or {}
    plain = [fence for fence in fences if results.get(fence[0]) is None]
    landed: set[int] = set()
    if plain:
        stmt = _complete_statement(dialect, now, with_result=False)
        params = {"worker_id": worker_id, **dialect.fence_parameters(plain)}
        options = dialect.table_options
        result = dialect.execute_returning(conn, stmt, params, execution_options=options)
        landed |= set(result.scalars().all())
    for fence in fences:
        if results.get(fence[0]) is not None:
            stmt = _complete_statement(dialect, now, with_result=True)
            params = {
                "worker_id": worker_id,
                "result": results[fence[0]],
                **dialect.fence_parameters([fence]),
            }
            options = dialect.table_options
            result = dialect.execute_returning(conn, stmt, params, execution_options=options)
            landed |= set(result.scalars().all())
    return landed


def _json_decoder(conn: Connection) -> Callable[[str], Any]:
    """The engine's ``create_engine(json_deserializer=…)``, which the JSON column type would
    have used for a claim's payload, else ``json.loads``."""
    return getattr(conn.dialect, "_json_deserializer", None) or json.loads


#: Statements built once per backend (and queue set) instead of on every call: building a
#: statement and its cache key costs more than a small claim or completion itself.
_STATEMENTS: dict[Hashable, Any] = {}
_MAX_STATEMENTS = 256


def _cached(key: Hashable, build: Callable[[], T]) -> T:
    stmt = _STATEMENTS.get(key)
    if stmt is None:
        if len(_STATEMENTS) >= _MAX_STATEMENTS:
            _STATEMENTS.clear()
        stmt = _STATEMENTS[key] = build()
    return cast(T, stmt)


def _complete_statement(dialect: Dialect, now: datetime | None, *, with_result: bool) -> Update:
    """The fenced move to ``succeeded`` for ``:fences`` of ``:worker_id`` (and ``:result``)."""
    if now is None:
        key = ("complete", type(dialect), with_result)
        return _cached(key, lambda: _build_complete(dialect, None, with_result))
    return _build_complete(dialect, now, with_result)


def _build_complete(dialect: Dialect, now: datetime | None, with_result: bool) -> Update:
    current = dialect.now(now)
    values: dict[str, Any] = {
        "status": "succeeded",
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
        .returning(jobs.c.id)
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
            .where(*_leased_by(dialect, worker_id, [fence]))
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
    now: datetime | None = None,
) -> bool:
    """Record an attempt that did not succeed: ``failed`` with a retry time, ``dead``, or — for
    a snooze — back to ``queued`` without using up the attempt. A job whose cancellation was
    requested while it ran is ``cancelled`` instead of retried.

    Returns whether the lease was still ours (``False``: someone else owns the outcome).
    """
    current = dialect.now(now)
    values: dict[str, Any] = {"updated_at": current, "lease_expires_at": None}
    if failure.snooze:
        values["status"] = "queued"
        values["attempts"] = jobs.c.attempts - 1
        values["next_run_at"] = dialect.now_plus(failure.retry_in, now)
    else:
        values["last_error"] = failure.last_error
        values["errors"] = list(failure.errors)
    if failure.dead:
        values["status"] = "dead"
        values["finished_at"] = current
    elif not failure.snooze:
        cancelled = jobs.c.cancel_requested_at.is_not(None)
        values["status"] = case((cancelled, "cancelled"), else_="failed")
        values["finished_at"] = case((cancelled, current), else_=None)
        values["next_run_at"] = dialect.now_plus(failure.retry_in, now)
    stmt = (
        update(jobs)
        .where(*_leased_by(dialect, worker_id, [(failure.job_id, failure.attempt)]))
        .values(**values)
        .returning(jobs.c.id)
    )
    return dialect.execute_returning(conn, stmt).first() is not None


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
        .where(*_leased_by(dialect, worker_id, fences))
        .values(
            status="queued",
            attempts=jobs.c.attempts - 1,
            locked_by=None,
            lease_expires_at=None,
            next_run_at=current,
            updated_at=current,
        )
        .returning(jobs.c.id)
    )
    return set(dialect.execute_returning(conn, stmt).scalars())


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
        .where(*_leased_by(dialect, worker_id, fences))
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
    attempt, and PostgreSQL reapers skip rows another reaper holds.
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
            current.label("db_now"),
        )
        .where(jobs.c.status == "running", jobs.c.lease_expires_at < current)
        .order_by(jobs.c.lease_expires_at)
        .limit(limit)
    )
    retried: list[int] = []
    dead: list[int] = []
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
    return retried, dead
