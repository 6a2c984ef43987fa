"""The most frequent errors of unhandled failures without reading every dead job: a rollup of
the errors of unhandled dead jobs that finished before the finished counts' mark, plus those of
the jobs that died since and of the failed ones (waiting for a retry), counted live.

An unhandled dead job's error never changes; it stops counting only when a person requeues or
discards the job or retention deletes it. So the rollup is folded with the finished counts
(:func:`fold_errors`, in the same transaction and window, under the mark's lock), and each of
those three takes the mark's lock first and subtracts the jobs the rollup had counted
(:func:`forget_handled`): no fold counts a job while it is being taken
away. The errors are grouped by their first ``ERROR_GROUP_CHARS`` characters, computed by the
database in every statement (so the rollup's keys are what the live part groups by).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import (
    BigInteger,
    Connection,
    String,
    bindparam,
    case,
    delete,
    func,
    literal,
    select,
    type_coerce,
    union_all,
)
from sqlalchemy.sql.elements import ColumnElement

from sqlqueue._errors import DatabaseError
from sqlqueue._schema import ERROR_GROUP, count_marks, error_counts, jobs
from sqlqueue._types import UtcDateTime
from sqlqueue.dialects import Dialect

__all__ = [
    "fold_errors",
    "forget_handled",
    "read_top_errors",
]

#: The mark row shared with the finished counts (sqlqueue/_store/counts.py).
_MARK = "finished"
#: The error of the reading statement's extra row that says whether the mark moved.
_CHECK = "~sqlqueue: mark unchanged"
#: How often a read retries when a fold moves the mark under it (folds are a minute apart).
_READ_TRIES = 5


def _unhandled_dead() -> list[ColumnElement[bool]]:
    """Dead jobs with an error that nobody has requeued or discarded."""
    return [
        jobs.c.status == "dead",
        jobs.c.last_error.is_not(None),
        jobs.c.requeued_as.is_(None),
        jobs.c.discarded_at.is_(None),
    ]


def _text(value: object) -> str:
    """An error group as text (MariaDB/MySQL hand back the rollup's bytes in a union)."""
    return value.decode("utf-8") if isinstance(value, bytes | bytearray) else str(value)


def read_top_errors(conn: Connection, dialect: Dialect, *, limit: int) -> list[tuple[str, int]]:
    """The ``limit`` most frequent errors of unhandled failed and dead jobs, with their counts,
    most frequent first (ties by error): the rollup, plus the dead jobs that finished since the
    mark (a short range of ``ix_sqlqueue_jobs_finished``) and the failed ones, in one statement.

    As :func:`sqlqueue._store.counts.read_finished_counts` does, the mark is read first and
    bound as a constant, and the statement also says whether it is still the one read: if a
    fold moved it in between, the rollup may already hold jobs the live part counts again,
    and the read is made again."""
    for _ in range(_READ_TRIES):
        mark = conn.execute(
            select(count_marks.c.folded_until).where(count_marks.c.name == _MARK)
        ).scalar_one_or_none()
        error = type_coerce(ERROR_GROUP, String()).label("error")
        n = func.count().label("n")
        branches = [
            select(
                type_coerce(error_counts.c.error, String()).label("error"),
                error_counts.c.count.label("n"),
            ),
            select(error, n)
            .select_from(jobs)
            .where(jobs.c.status == "failed", *_unhandled_dead()[1:])
            .group_by(ERROR_GROUP),
        ]
        current_mark = select(count_marks.c.folded_until).where(count_marks.c.name == _MARK)
        if mark is None:  # nothing folded: every dead job is counted live
            dead = select(error, n).select_from(jobs).where(*_unhandled_dead())
            still = current_mark.exists()
        else:
            bound = literal(mark, UtcDateTime())
            dead = (
                select(error, n)
                .select_from(jobs)
                .where(*_unhandled_dead(), dialect.selective(jobs.c.finished_at >= bound))
            )
            still = current_mark.where(count_marks.c.folded_until == bound).exists()
        branches.append(dead.group_by(ERROR_GROUP))
        both = union_all(*branches).subquery()
        total = func.sum(both.c.n)
        top = (
            select(both.c.error, total.label("n"))
            .group_by(both.c.error)
            .having(total > 0)
            .order_by(total.desc(), both.c.error)
            .limit(limit)
        )
        # The check row: 1 when the mark is still the one read (or still absent), else 0.
        unchanged = case((still, 1), else_=0) if mark is not None else case((still, 0), else_=1)
        check = select(literal(_CHECK, String()), unchanged)
        read = conn.execute(union_all(check, top.subquery().select()))
        rows = [(_text(error), int(n)) for error, n in read]
        if (_CHECK, 1) in rows:
            # A union keeps no order: the top rows are sorted again here.
            found = [row for row in rows if row[0] != _CHECK]
            return sorted(found, key=lambda row: (-row[1], row[0]))
    raise DatabaseError(  # pragma: no cover - folds are a minute apart
        "the error counts kept changing while being read; try again"
    )


def fold_errors(conn: Connection, dialect: Dialect, mark: datetime, until: datetime) -> int:
    """Add to the rollup the errors of the unhandled dead jobs that finished in ``[mark,
    until)``; return how many jobs. Called by the fold, under the mark's lock."""
    span = (
        select(ERROR_GROUP, func.count())
        .select_from(jobs)
        .where(
            *_unhandled_dead(),
            dialect.selective(jobs.c.finished_at >= literal(mark, UtcDateTime())),
            jobs.c.finished_at < literal(until, UtcDateTime()),
        )
        .group_by(ERROR_GROUP)
    )
    counted = [(str(error), int(n)) for error, n in conn.execute(span)]
    for error, n in counted:
        dialect.execute_returning(
            conn,
            dialect.upsert(
                error_counts,
                values={"error": error, "count": n},
                conflict=["error"],
                set_={"count": error_counts.c.count + literal(n, BigInteger())},
                where=error_counts.c.count.is_not(None),
            ),
        )
    return sum(n for _, n in counted)


def forget_handled(conn: Connection, mark: datetime | None, job_ids: Sequence[int]) -> None:
    """Subtract from the rollup the jobs among ``job_ids`` it counted — unhandled dead ones
    that finished before ``mark`` — before a requeue or a discard marks them handled, or a
    prune deletes them. The
    caller holds the mark's lock (``mark``: as read under it; ``None``: nothing is folded)."""
    if mark is None or not job_ids:
        return
    counted = conn.execute(
        select(ERROR_GROUP, func.count())
        .select_from(jobs)
        .where(
            jobs.c.id.in_(job_ids),
            *_unhandled_dead(),
            jobs.c.finished_at < literal(mark, UtcDateTime()),
        )
        .group_by(ERROR_GROUP)
    ).all()
    _subtract(conn, Counter({str(error): int(n) for error, n in counted}))


def _subtract(conn: Connection, counted: Counter[str]) -> None:
    """Take ``counted`` jobs off their errors' rows, and drop the rows that reach zero (the
    table holds the errors of jobs still waiting for a person)."""
    if not counted:
        return
    conn.execute(_SUBTRACT, [{"e": error, "n": n} for error, n in sorted(counted.items())])
    conn.execute(delete(error_counts).where(error_counts.c.count <= 0))


#: Take ``n`` jobs off an error's count.
_SUBTRACT = (
    error_counts.update()
    .where(error_counts.c.error == bindparam("e"))
    .values(count=error_counts.c.count - bindparam("n", type_=BigInteger()))
)
