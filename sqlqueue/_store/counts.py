"""Counting the finished history without reading it: a rollup of finished jobs by status, queue
and type, plus a live count of those finished since the rollup's mark.

A finished job's status, queue and type never change again, so once counted it stays counted
until it is deleted. :func:`fold_counts` moves jobs that finished before ``now - margin`` into
``sqlqueue_finished_counts`` and advances the mark; :func:`prune_counted` subtracts what retention
deletes. Both lock the mark row (SQLite: the write lock), so they take turns and nothing is
counted twice. :func:`read_finished_counts` adds the rollup to the jobs finished since the mark
in one statement, so it reads both from the same snapshot. A worker folds every minute; if none
does, the counts stay exact and only get slower (the live part grows).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import (
    BigInteger,
    Connection,
    bindparam,
    case,
    func,
    literal,
    select,
    union_all,
)
from sqlalchemy.sql.elements import ColumnElement

from sqlqueue._errors import DatabaseError
from sqlqueue._schema import count_marks, error_counts, finished_counts, jobs
from sqlqueue._store.error_counts import fold_errors
from sqlqueue._store.readable import readable
from sqlqueue._types import UtcDateTime
from sqlqueue.dialects import Dialect

__all__ = [
    "FINISHED",
    "FOLD_WINDOW_SECONDS",
    "CountsBusy",
    "Fold",
    "MarkMissing",
    "create_mark",
    "fold_counts",
    "lock_for_handling",
    "lock_for_prune",
    "prune_counted",
    "read_finished_counts",
    "reset_counts",
    "subtract_counted",
]

#: The statuses a job never leaves (its row changes no more but for dead-letter bookkeeping).
FINISHED = ("succeeded", "dead", "cancelled")

#: The mark row of the finished-jobs rollup.
MARK = "finished"

#: The most finishing time one fold counts in (a long history folds in several transactions).
FOLD_WINDOW_SECONDS = 86400.0

#: The mark before any fold: every finished job is counted live.
_BEGINNING = datetime(1970, 1, 1, tzinfo=UTC)

Key = tuple[str, str, str]


def _mark() -> ColumnElement[datetime]:
    """The rollup's mark as a scalar subquery (the beginning of time without one)."""
    folded = select(count_marks.c.folded_until).where(count_marks.c.name == MARK)
    return func.coalesce(folded.scalar_subquery(), literal(_BEGINNING, UtcDateTime()))


def read_finished_counts(conn: Connection, dialect: Dialect) -> list[tuple[str, str, str, int]]:
    """``(status, queue, job_type, count)`` of every finished job: the rollup plus those that
    finished since its mark (read from ``ix_sqlqueue_jobs_finished`` alone).

    The mark is read first and bound as a constant (a planner cannot use the index range for a
    subquery: SQLite then read every finished row); the counting statement also says whether the
    mark is still the one read, and if a fold moved it in between — so the rollup already holds
    rows the live part would count again — it is read again."""
    for _ in range(_READ_TRIES):
        mark: datetime = conn.execute(select(_mark())).scalar_one()
        bound = literal(mark, UtcDateTime())
        rolled = select(
            finished_counts.c.status,
            finished_counts.c.queue,
            finished_counts.c.job_type,
            finished_counts.c.count.label("n"),
        )
        live = (
            select(jobs.c.status, jobs.c.queue, jobs.c.job_type, func.count().label("n"))
            .where(jobs.c.status.in_(FINISHED), dialect.selective(jobs.c.finished_at >= bound))
            .group_by(jobs.c.status, jobs.c.queue, jobs.c.job_type)
        )
        live = readable(live, dialect)  # after a reset, moved jobs are counted live too
        same_mark = select(
            literal(_CHECK), literal(""), literal(""), case((_mark() == bound, 1), else_=0)
        )
        totals: Counter[Key] = Counter()
        unchanged = False
        for status, queue, job_type, n in conn.execute(union_all(rolled, live, same_mark)):
            if status == _CHECK:
                unchanged = bool(n)
            else:
                totals[(status, queue, job_type)] += int(n)
        if unchanged:
            return [(*key, n) for key, n in sorted(totals.items()) if n]
    raise DatabaseError(  # pragma: no cover - folds are a minute apart
        "the finished-job counts kept changing while being read; try again"
    )


#: How often a read retries when a fold moves the mark under it (folds are a minute apart).
_READ_TRIES = 5
#: The status of the counting statement's extra row that says whether the mark moved.
_CHECK = "~mark-unchanged"


class CountsBusy(DatabaseError):
    """Another transaction holds the counts' mark (a fold or a prune is under way)."""


class MarkMissing(Exception):
    """The counts' mark is not there yet (a new database, or after :func:`reset_counts`):
    create it with :func:`create_mark` in a transaction of its own, then try again."""


def create_mark(conn: Connection, dialect: Dialect) -> None:
    """Create the mark at the beginning of time unless it is there: one statement, committed
    on its own, so that no fold's transaction ever holds an uncommitted mark row that other
    workers' inserts would wait for (a worker stalled in the first fold of a database's life
    would otherwise stall every other worker's database thread)."""
    dialect.execute_returning(
        conn,
        dialect.conflict_insert(count_marks)
        .values(name=MARK, folded_until=_BEGINNING)
        .on_conflict_do_nothing(index_elements=[count_marks.c.name]),
    )


def _locked_mark(conn: Connection, dialect: Dialect) -> datetime | None:
    """The mark, locked until the transaction ends, or ``None`` when another transaction holds
    it: a worker must never wait on it (a stalled worker holding it would stall them all), so
    a fold then skips its turn and a prune batch says so. Raises :class:`MarkMissing` when
    there is no mark to lock (created first, so two first folds cannot both count
    everything)."""
    query = select(count_marks.c.folded_until).where(count_marks.c.name == MARK)
    mark: datetime | None = conn.execute(dialect.skip_locked(query)).scalar_one_or_none()
    if mark is None and conn.execute(query).first() is None:
        raise MarkMissing("the finished-job counts have no mark yet")
    return mark


def _add(conn: Connection, dialect: Dialect, counts: Iterable[tuple[Key, int]]) -> None:
    """Add ``counts`` (negative to subtract) to the rollup."""
    for (status, queue, job_type), n in counts:
        if not n:
            continue
        dialect.execute_returning(
            conn,
            dialect.upsert(
                finished_counts,
                values={"status": status, "queue": queue, "job_type": job_type, "count": n},
                conflict=["status", "queue", "job_type"],
                set_={"count": finished_counts.c.count + literal(n, BigInteger())},
                where=finished_counts.c.count.is_not(None),
            ),
        )


@dataclass(frozen=True, kw_only=True)
class Fold:
    """What one fold did: how many jobs it counted in, and whether the mark caught up."""

    folded: int
    caught_up: bool


def fold_counts(
    conn: Connection,
    dialect: Dialect,
    *,
    margin: float = 60.0,
    window: float = FOLD_WINDOW_SECONDS,
) -> Fold:
    """Count the jobs that finished after the mark and before ``margin`` seconds ago into the
    rollup, at most ``window`` seconds of them (from the first finish after the mark), and move
    the mark there.

    The margin and the oldest open writing transaction bound the mark: a job whose
    transaction has not committed yet may still have finished before it (PostgreSQL stamps
    ``finished_at`` when the statement starts), and it must not fall below the mark uncounted.
    The window keeps each fold a short transaction (SQLite holds its write lock meanwhile): a
    long history is folded in several. The errors of the unhandled dead jobs in the window are
    folded too (:func:`~sqlqueue._store.error_counts.fold_errors`)."""
    mark = _locked_mark(conn, dialect)
    if mark is None:  # another fold (or a prune) is under way: its turn, not ours
        return Fold(folded=0, caught_up=True)
    until: datetime = conn.execute(select(dialect.now_plus(-float(margin)))).scalar_one()
    open_since = dialect.oldest_open_write(conn)
    if open_since is not None and open_since < until:
        until = open_since
    if until <= mark:
        return Fold(folded=0, caught_up=True)
    first = _first_finish_after(conn, dialect, mark)
    caught_up = True
    if first is not None and first + timedelta(seconds=window) < until:
        until, caught_up = first + timedelta(seconds=window), False
    counts: list[tuple[Key, int]] = []
    if first is not None and first < until:
        span = (
            select(jobs.c.status, jobs.c.queue, jobs.c.job_type, func.count())
            .where(
                jobs.c.status.in_(FINISHED),
                dialect.selective(jobs.c.finished_at >= literal(mark, UtcDateTime())),
                jobs.c.finished_at < literal(until, UtcDateTime()),
            )
            .group_by(jobs.c.status, jobs.c.queue, jobs.c.job_type)
        )
        counts = [((s, q, t), int(n)) for s, q, t, n in conn.execute(readable(span, dialect))]
        _add(conn, dialect, counts)
        fold_errors(conn, dialect, mark, until)
    conn.execute(count_marks.update().where(count_marks.c.name == MARK).values(folded_until=until))
    return Fold(folded=sum(n for _, n in counts), caught_up=caught_up)


def _first_finish_after(conn: Connection, dialect: Dialect, mark: datetime) -> datetime | None:
    """The earliest finishing time at or after ``mark``: one status at a time, so each is one
    index lookup (with ``status IN (…)`` PostgreSQL read every row after the mark instead).
    Moved jobs count too (they are all before the mark, unless the rollup was reset)."""
    firsts = [
        conn.execute(
            readable(
                select(func.min(jobs.c.finished_at)).where(
                    jobs.c.status == status, jobs.c.finished_at >= literal(mark, UtcDateTime())
                ),
                dialect,
            )
        ).scalar_one()
        for status in FINISHED
    ]
    known = [first for first in firsts if first is not None]
    return min(known) if known else None


def lock_for_prune(conn: Connection, dialect: Dialect) -> datetime:
    """Take the mark's lock before deleting finished jobs, so no fold counts rows this
    transaction is deleting; return the mark (deleted jobs that finished before it were counted,
    see :func:`prune_counted`). Raises
    :class:`CountsBusy` rather than waiting when another transaction holds it."""
    mark = _locked_mark(conn, dialect)
    if mark is None:
        raise CountsBusy("a fold or another prune holds the finished-job counts; try again")
    return mark


def lock_for_handling(conn: Connection, dialect: Dialect) -> datetime:
    """Take the mark's lock before a requeue or a discard marks dead jobs handled, waiting for
    a fold or a prune that holds it (they are short), so no fold counts a job's error while it
    is being taken away; return the mark (the jobs that finished before it are in the error
    rollup, see :func:`~sqlqueue._store.error_counts.forget_handled`). Taken before any job
    row, as prunes do, so the two never wait for each other in a circle. Raises
    :class:`MarkMissing` when there is none yet."""
    query = select(count_marks.c.folded_until).where(count_marks.c.name == MARK)
    mark: datetime | None = conn.execute(dialect.lock_row(query)).scalar_one_or_none()
    if mark is None:
        raise MarkMissing("the finished-job counts have no mark yet")
    return mark


def prune_counted(conn: Connection, dialect: Dialect, deleted: Iterable[Any]) -> None:
    """Subtract from the rollup the deleted jobs it had counted: ``deleted`` holds a row of
    status, queue, job_type and whether the job finished before the mark (read under
    :func:`lock_for_prune`'s lock) for each.

    A counted job's row is in the rollup (the fold that counted it wrote it), so this is one
    UPDATE, built once and run for every key in one round trip: an upsert per key, built per
    call, cost a prune batch as much as its deletion."""
    counted: Counter[Key] = Counter()
    for status, queue, job_type, before_mark in deleted:
        if status in FINISHED and before_mark:
            counted[(status, queue, job_type)] += 1
    subtract_counted(conn, counted)


def subtract_counted(conn: Connection, counted: Counter[Key]) -> None:
    """Take ``counted`` jobs (by status, queue and type, all counted by the rollup) off it: one
    UPDATE run for every key in one round trip (what a prune batch or a dropped day of the
    history deleted, under :func:`lock_for_prune`'s lock)."""
    if counted:
        conn.execute(
            _SUBTRACT,
            [{"s": s, "q": q, "t": t, "n": n} for (s, q, t), n in sorted(counted.items())],
        )


#: Take ``n`` pruned jobs off a key's count.
_SUBTRACT = (
    finished_counts.update()
    .where(
        finished_counts.c.status == bindparam("s"),
        finished_counts.c.queue == bindparam("q"),
        finished_counts.c.job_type == bindparam("t"),
    )
    .values(count=finished_counts.c.count - bindparam("n", type_=BigInteger()))
)


def reset_counts(conn: Connection) -> None:
    """Forget the rollups (finished jobs and errors): stats count every finished job live until
    the next fold counts them in again. For after finished jobs were changed or deleted by hand
    (prune, requeue and discard keep the rollups right by themselves)."""
    conn.execute(count_marks.delete())
    conn.execute(finished_counts.delete())
    conn.execute(error_counts.delete())
