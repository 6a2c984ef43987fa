"""Operators' actions on waiting jobs, each recorded with who and why in
``sqlqueue_job_actions`` in the transaction that changes the job: cancel (one job or every job a
filter matches), make due now, and reschedule. Requeue and discard record on the job row
itself (see :mod:`sqlqueue._store.deadletter`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import Connection, RowMapping, insert, select, update

from sqlqueue._errors import JobNotFound, JobStateError
from sqlqueue._job import Job
from sqlqueue._job_action import JobAction
from sqlqueue._schema import job_actions, jobs
from sqlqueue._store.batches import Endings, hold_batches, settle
from sqlqueue._store.filters import JobFilter
from sqlqueue._store.readable import moved_row
from sqlqueue._store.rows import row_to_job
from sqlqueue.dialects import Dialect

__all__ = [
    "WAITING",
    "CancelBatch",
    "Record",
    "cancel_batch",
    "make_due",
    "read_job_actions",
    "record_actions",
    "reschedule_job",
    "wait_for_holder",
]

#: The statuses of jobs waiting for a run: what cancel, reschedule and run-now change.
WAITING = ("queued", "failed")
#: What cancel also takes: a workflow step still waiting for the steps before it.
_CANCELLABLE = (*WAITING, "waiting")


@dataclass(frozen=True, kw_only=True)
class Record:
    """One action to write down for each job it changed: what, who, why, and what it set."""

    action: str
    by: str
    reason: str
    detail: Mapping[str, Any] | None = None


def record_actions(
    conn: Connection, dialect: Dialect, job_ids: Iterable[int], record: Record | None
) -> None:
    """Write ``record`` for each of ``job_ids`` (nothing for ``None``), stamped by the database
    clock."""
    rows = (
        [
            {
                "job_id": int(job_id),
                "action": record.action,
                "by": record.by,
                "reason": record.reason,
                "detail": None if record.detail is None else dict(record.detail),
            }
            for job_id in job_ids
        ]
        if record is not None
        else []
    )
    if rows:
        conn.execute(insert(job_actions).values(at=dialect.now()), rows)


def read_job_actions(conn: Connection, job_id: int) -> list[JobAction]:
    """The actions recorded on ``job_id``, oldest first."""
    query = select(job_actions).where(job_actions.c.job_id == job_id).order_by(job_actions.c.id)
    return [
        JobAction(
            job_id=row.job_id,
            action=row.action,
            by=row.by,
            reason=row.reason,
            detail=dict(row.detail) if row.detail else {},
            at=row.at,
        )
        for row in conn.execute(query)
    ]


def _locked_job(conn: Connection, dialect: Dialect, job_id: int) -> RowMapping:
    row = conn.execute(dialect.lock_row(select(jobs).where(jobs.c.id == job_id))).mappings().first()
    row = row if row is not None else moved_row(conn, dialect, job_id)
    if row is None:
        raise JobNotFound(f"there is no job {job_id}")
    return row


def reschedule_job(
    conn: Connection, dialect: Dialect, job_id: int, run_at: datetime, record: Record
) -> Job:
    """Give a queued or failed job the run time ``run_at`` (its attempts are kept); return it."""
    row = _locked_job(conn, dialect, job_id)
    if row["status"] not in WAITING:
        raise JobStateError(
            f"job {job_id} is {row['status']}; only queued or failed jobs can be rescheduled"
        )
    updated = (
        dialect.execute_returning(
            conn,
            update(jobs)
            .where(jobs.c.id == job_id, jobs.c.status == row["status"])
            .values(next_run_at=run_at, updated_at=dialect.now())
            .returning(*jobs.c),
        )
        .mappings()
        .one()
    )
    record_actions(conn, dialect, [job_id], record)
    return row_to_job(updated)


def make_due(
    conn: Connection,
    dialect: Dialect,
    job_filter: JobFilter,
    statuses: Sequence[str],
    record: Record | None,
) -> list[int]:
    """Set ``next_run_at`` to now on every job in ``statuses`` matching ``job_filter`` whose
    next run is still in the future; return their ids. Attempt counts are kept."""
    current = dialect.now()
    stmt = (
        update(jobs)
        .where(*job_filter.clauses(), jobs.c.status.in_(statuses), jobs.c.next_run_at > current)
        .values(next_run_at=current, updated_at=current)
        .returning(jobs.c.id)
    )
    ids = [int(job_id) for job_id in dialect.execute_returning(conn, stmt).scalars()]
    record_actions(conn, dialect, ids, record)
    return ids


class CancelBatch(NamedTuple):
    """One filtered cancel's transaction: the jobs it cancelled, whether it read every job the
    filter still matches (then no further batch is needed), and the matching jobs it left
    waiting because another transaction held their rows (see :func:`wait_for_holder`)."""

    cancelled: list[int]
    exhausted: bool
    held: list[int]


def cancel_batch(
    conn: Connection, dialect: Dialect, job_filter: JobFilter, *, limit: int, record: Record | None
) -> CancelBatch:
    """Cancel up to ``limit`` queued, failed or waiting jobs matching ``job_filter``, oldest
    first; return their ids. Rows another transaction holds are skipped and returned as
    ``held`` if they were still waiting when it read them: a worker claiming one keeps it, but
    a holder may also leave it waiting (a claim that locks more rows than it leases, as
    MariaDB's for a worker of several queues does), so the caller waits for the holder and
    runs another batch. Children of batches count in their batch in this transaction.

    The rows are taken in the lock order of :mod:`sqlqueue._store.batches`: the queued and
    failed jobs (skipping those held), then every batch and workflow of the round in id
    order, then the waiting steps, which their workflows' releases lock after the workflows'
    rows (read before without a lock, taken skipping those held: this transaction then waits
    for no job row, so two filtered cancels over the same workflows never wait crosswise).
    Every row is read without a lock and then locked by its key: a locking scan by the filter
    would take (on InnoDB) each row it examines, waiting steps too, before it checks them.

    A step that ended or was claimed while this waited for its workflow is dropped, so fewer
    than ``limit`` may be cancelled although more match: ``exhausted`` says, from how many
    candidates were read, whether another batch may find more (jobs ``held`` aside)."""
    clauses = job_filter.clauses()
    steps = [
        (int(job_id), batch_id)
        for job_id, batch_id in conn.execute(
            select(jobs.c.id, jobs.c.batch_id)
            .where(*clauses, jobs.c.status == "waiting")
            .order_by(jobs.c.id)
            .limit(limit)
        )
    ]
    taken, held = _take_queued(conn, dialect, clauses, limit, [job_id for job_id, _ in steps])
    exhausted = len(taken) + len(steps) < limit
    queued = {job_id for job_id, _ in taken}  # a step released meanwhile: taken as queued
    steps = [(job_id, batch_id) for job_id, batch_id in steps if job_id not in queued]
    chosen = sorted(
        [(job_id, batch_id, False) for job_id, batch_id in taken]
        + [(job_id, batch_id, True) for job_id, batch_id in steps]
    )[:limit]  # the oldest of both; only steps, never locked, fall past the cut
    if not chosen:
        return CancelBatch([], exhausted, held)
    hold_batches(conn, dialect, [int(batch_id) for _, batch_id, _ in chosen if batch_id])
    ids = [job_id for job_id, _, waiting in chosen if not waiting]
    kept = [job_id for job_id, _, waiting in chosen if waiting]
    if kept:  # still waiting, or released meanwhile (then queued, and skipped if claimed)
        got = [
            int(job_id)
            for job_id in conn.execute(
                dialect.skip_locked(
                    select(jobs.c.id)
                    .where(jobs.c.id.in_(kept), jobs.c.status.in_(_CANCELLABLE))
                    .order_by(jobs.c.id)
                )
            ).scalars()
        ]
        ids.extend(got)
        held = sorted([*held, *_still(conn, set(kept) - set(got), _CANCELLABLE)])
    if not ids:
        return CancelBatch([], exhausted, held)
    current = dialect.now()
    stmt = (
        update(jobs)
        .where(jobs.c.id.in_(ids), jobs.c.status.in_(_CANCELLABLE))
        .values(status="cancelled", finished_at=current, updated_at=current)
        .returning(jobs.c.id, jobs.c.batch_id)
    )
    done = dialect.execute_returning(conn, stmt).all()
    endings = Endings()
    for job_id, batch_id in done:
        endings.ended(batch_id, "cancelled", job_id=job_id)
    if endings:
        settle(conn, dialect, endings)
    cancelled = sorted(int(job_id) for job_id, _ in done)
    record_actions(conn, dialect, cancelled, record)
    return CancelBatch(cancelled, exhausted, held)


def wait_for_holder(conn: Connection, dialect: Dialect, job_id: int) -> None:
    """Wait until no other transaction holds job ``job_id``'s row: lock it, in a transaction
    of the caller's that holds no other row and ends right after. A filtered cancel waits so
    for a row it had to skip (:attr:`CancelBatch.held`), then reads it again in a batch of its
    own: waiting in the batch instead, it would keep the row locked even where the holder
    had claimed it, and a worker's round holding the batch's row could then wait for it
    (recording the job's start) while the batch waited for the batch's row."""
    conn.execute(dialect.lock_row(select(jobs.c.id).where(jobs.c.id == job_id))).all()


def _still(conn: Connection, job_ids: Iterable[int], statuses: Sequence[str]) -> list[int]:
    """Those of ``job_ids`` whose committed status is one of ``statuses`` (read without a
    lock: a row a locking read skipped was held, not changed, if it still is)."""
    wanted = sorted(job_ids)
    if not wanted:
        return []
    query = select(jobs.c.id).where(jobs.c.id.in_(wanted), jobs.c.status.in_(statuses))
    return sorted(int(job_id) for job_id in conn.execute(query).scalars())


def _take_queued(
    conn: Connection, dialect: Dialect, clauses: Sequence[Any], limit: int, steps: Sequence[int]
) -> tuple[list[tuple[int, int | None]], list[int]]:
    """Lock the queued or failed jobs matching ``clauses`` that are among the ``limit`` oldest
    of them and the waiting ``steps`` (ids, ascending), skipping those another transaction
    holds; ``(id, batch id)`` each, and the ids of the skipped ones still queued or failed.
    No row past that cut is locked: it would stay locked until the commit for nothing, and
    claims would skip it. Read in id order without a lock and locked by key, a page at a time
    past the ones held, so a claim taking the oldest at the same moment does not leave the
    batch short."""
    taken: list[tuple[int, int | None]] = []
    held: list[int] = []
    after = 0
    while True:
        later = [job_id for job_id in steps if job_id > after]
        wanted = limit - len(taken) - (len(steps) - len(later))
        if wanted <= 0:
            break
        page = [
            int(job_id)
            for job_id in conn.execute(
                select(jobs.c.id)
                .where(*clauses, jobs.c.status.in_(WAITING), jobs.c.id > after)
                .order_by(jobs.c.id)
                .limit(wanted)
            ).scalars()
        ]
        cut = sorted({*page, *later})[:wanted]
        within = [job_id for job_id in page if job_id <= cut[-1]] if cut else []
        if not within:
            break
        after = within[-1]
        locked = [
            (int(job_id), batch_id)
            for job_id, batch_id in conn.execute(
                dialect.skip_locked(
                    select(jobs.c.id, jobs.c.batch_id)
                    .where(jobs.c.id.in_(within), jobs.c.status.in_(WAITING))
                    .order_by(jobs.c.id)
                )
            )
        ]
        taken.extend(locked)
        if len(locked) < len(within):
            held.extend(_still(conn, set(within) - {job_id for job_id, _ in locked}, WAITING))
        if len(within) < len(page) and len(locked) == len(within):
            break  # the cut is full: the steps fill what the page does not
        if len(page) < wanted and len(within) == len(page):
            break
    return taken, held
