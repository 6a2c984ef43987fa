"""The finished history on a backend that partitions it by day
(``Dialect.supports_history_partitions``: PostgreSQL): the mover, and retention by dropping days.

**What moves.** A job moves from ``sqlqueue_jobs`` to ``sqlqueue_jobs_history`` only when
nothing can act on it any more and nothing looks it up in the hot table:

- it **succeeded** (dead jobs stay: a person may requeue or discard them, and the error rollup
  counts them; cancelled jobs stay: their retention may differ from succeeded jobs');
- it finished at least ``Retention.history_after`` seconds ago (just-finished results are read
  from the hot table) and before the counts' mark (the rollup counted it, so dropping its day
  subtracts exactly what was counted), and not before the succeeded retention's cut-off (what
  is already past retention is pruned where it is, so no day is written after it was dropped);
- it carries **no idempotency key and no unique key** (the hot table's unique index and the
  unique-key check read ``sqlqueue_jobs`` alone: a key blocks a duplicate until its job is
  pruned, exactly as before);
- it belongs to **no batch or workflow** (their rows, counts, pages and retention read the hot
  table: those jobs are pruned by the batched delete, as on every backend).

A move is one statement, ``WITH moved AS (DELETE … RETURNING *) INSERT INTO history SELECT *
FROM moved``, so a job is always in exactly one of the two tables, and it takes rows with
``SKIP LOCKED``, so it never waits on a worker. The partitions of the days a batch's jobs
finished on are created first (``CREATE TABLE`` then ``ATTACH PARTITION``, which takes SHARE
UPDATE EXCLUSIVE on the parent: claims never read the history, so nothing they do waits).
Reads that may meet a finished job read both tables (:mod:`sqlqueue._store.readable`).

**Retention.** The days whose end is older than the succeeded retention go in one
transaction: their jobs come off the counts' rollup, their tags and operators' actions are
deleted, and their tables are dropped (the drop detaches them; only readers of the history wait
for its short exclusive lock on the parent, never a claim). It commits whole or not at all, so
nothing is subtracted twice. A succeeded job is so kept for its retention and at most a day
more.
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, date, datetime, timedelta

from sqlalchemy import (
    Connection,
    delete,
    func,
    insert,
    literal,
    select,
)
from sqlalchemy.sql.elements import ColumnElement

from sqlqueue._schema import count_marks, job_actions, job_tags, jobs, jobs_history
from sqlqueue._store import counts
from sqlqueue._types import UtcDateTime
from sqlqueue.dialects import Dialect, history_partitions_of

__all__ = ["drop_days", "movable", "move_batch"]

#: The one status that moves (see the module's docstring).
MOVED_STATUS = "succeeded"


def movable(dialect: Dialect, *, after: float, keep: float | None) -> list[ColumnElement[bool]]:
    """The jobs the mover may take: succeeded ``after`` seconds ago or more, counted, within
    retention (``keep`` seconds; ``None``: kept for ever), and bound to no key, batch or
    workflow."""
    mark = (
        select(count_marks.c.folded_until).where(count_marks.c.name == "finished").scalar_subquery()
    )
    where = [
        jobs.c.status == MOVED_STATUS,
        jobs.c.finished_at < dialect.now_plus(-float(after)),
        jobs.c.finished_at < mark,
        jobs.c.batch_id.is_(None),
        jobs.c.unique_key.is_(None),
        jobs.c.idempotency_key.is_(None),
    ]
    if keep is not None:
        where.append(jobs.c.finished_at >= dialect.now_plus(-float(keep)))
    return where


def move_batch(
    conn: Connection, dialect: Dialect, *, after: float, keep: float | None, limit: int
) -> int:
    """Move up to ``limit`` of the oldest movable jobs into the history; return how many moved
    (0: none is movable). The days they finished on get their partitions first (a day without
    a job gets an empty one, dropped with the others), so the move never meets a missing one."""
    ddl = history_partitions_of(dialect)
    if ddl is None:
        return 0
    where = movable(dialect, after=after, keep=keep)
    first = select(jobs.c.finished_at).where(*where).order_by(jobs.c.finished_at).limit(limit)
    span = first.subquery()
    oldest, newest = conn.execute(
        select(func.min(span.c.finished_at), func.max(span.c.finished_at))
    ).one()
    if oldest is None:
        return 0
    days = _days(oldest, newest)
    have = {p.day for p in ddl.history_partitions(conn) if p.attached}
    for day in days:
        if day not in have:
            ddl.create_history_partition(conn, day)
    end = datetime(days[-1].year, days[-1].month, days[-1].day, tzinfo=UTC) + timedelta(days=1)
    chosen = dialect.skip_locked(
        select(jobs.c.id)
        .where(*where, jobs.c.finished_at < literal(end, UtcDateTime()))
        .order_by(jobs.c.finished_at)
        .limit(limit)
    )
    moved = delete(jobs).where(jobs.c.id.in_(chosen.scalar_subquery())).returning(*jobs.c)
    rows = moved.cte("moved")
    names = [column.name for column in jobs_history.c]
    statement = (
        insert(jobs_history)
        .from_select(names, select(*(rows.c[n] for n in names)))
        .returning(jobs_history.c.id)
    )
    return len(conn.execute(statement).all())  # (a rowcount of a DML CTE reads -1)


def _days(oldest: datetime, newest: datetime) -> list[date]:
    """Every UTC day from ``oldest``'s to ``newest``'s."""
    first, last = oldest.astimezone(UTC).date(), newest.astimezone(UTC).date()
    return [first + timedelta(days=n) for n in range((last - first).days + 1)]


def drop_days(conn: Connection, dialect: Dialect, *, older_than: float) -> int:
    """Drop the days of the history that ended more than ``older_than`` seconds ago (database
    clock), in the caller's transaction; return how many jobs went.

    Five statements however many days: under the counts' mark's lock (as a prune batch), the
    counted jobs of those days come off the rollup, their tags and actions are deleted (each
    read through the parent, which prunes to exactly those days: every job that finished
    before the end of the last of them is in one of them), then one ``DROP TABLE`` drops them
    all. The exclusive lock it takes on the parent is held from the drop to the commit, and
    all of it commits, or none (nothing is ever subtracted twice)."""
    ddl = history_partitions_of(dialect)
    if ddl is None:
        return 0
    cutoff: datetime = conn.execute(select(dialect.now_plus(-float(older_than)))).scalar_one()
    expired = [p for p in ddl.history_partitions(conn) if p.attached and p.ends <= cutoff]
    if not expired:
        return 0
    mark = counts.lock_for_prune(conn, dialect)
    before = jobs_history.c.finished_at < literal(max(p.ends for p in expired), UtcDateTime())
    counted = (jobs_history.c.finished_at < literal(mark, UtcDateTime())).label("counted")
    key = (jobs_history.c.status, jobs_history.c.queue, jobs_history.c.job_type)
    total = 0
    rollup: Counter[tuple[str, str, str]] = Counter()
    for status, queue, job_type, was_counted, n in conn.execute(
        select(*key, counted, func.count()).where(before).group_by(*key, counted)
    ):
        total += int(n)
        if was_counted:
            rollup[(status, queue, job_type)] += int(n)
    counts.subtract_counted(conn, rollup)
    gone = select(jobs_history.c.id).where(before)
    conn.execute(delete(job_tags).where(job_tags.c.job_id.in_(gone)))
    conn.execute(delete(job_actions).where(job_actions.c.job_id.in_(gone)))
    ddl.drop_history_tables(conn, expired)
    return total
