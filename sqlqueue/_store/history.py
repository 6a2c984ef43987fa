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
finished on are created first, one mover at a time (an advisory lock; ``CREATE TABLE`` then
``ATTACH PARTITION``, which takes SHARE UPDATE EXCLUSIVE on the parent: claims never read the
history, so none of them waits).
Reads that may meet a finished job read both tables (:mod:`sqlqueue._store.readable`).

**Retention.** The days whose end is older than the succeeded retention go in one
transaction: under the counts' mark and a lock on the parent that waits for a move under way
and keeps others out (not readers), the days are listed, their jobs come off the counts'
rollup, their tags and operators' actions are deleted, and their tables are dropped (the drop
detaches them; readers of the history wait for its short exclusive lock on the parent, never a
claim). It commits whole or not at all, so nothing is subtracted twice, and what it counts is
exactly what it drops. A succeeded job is so kept for its retention and at most a day more.

**Never waiting long.** The duty worker runs both on its only database thread, between its
claims and heartbeats, so neither waits more than ``LOCK_TIMEOUT_MS`` for a table lock (a
``pg_dump`` or a report reading the history holds one): it raises :class:`HistoryBusy`, and
the duty tries at its next pass.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, date, datetime, timedelta

from sqlalchemy import (
    Connection,
    delete,
    func,
    insert,
    literal,
    select,
)
from sqlalchemy import exc as sa_exc
from sqlalchemy.sql.elements import ColumnElement

from sqlqueue._errors import DatabaseError
from sqlqueue._schema import count_marks, job_actions, job_tags, jobs, jobs_history
from sqlqueue._store import counts
from sqlqueue._types import UtcDateTime
from sqlqueue.dialects import (
    LOCK_TIMEOUT_MS,
    Dialect,
    HistoryPartition,
    HistoryPartitions,
    history_partitions_of,
)

__all__ = ["HistoryBusy", "drop_days", "movable", "movable_until", "move_batch"]

#: The one status that moves (see the module's docstring).
MOVED_STATUS = "succeeded"


class HistoryBusy(DatabaseError):
    """A move or a drop gave up waiting for a lock on the history (a long reader of it holds
    one): nothing was done, try at the next pass."""


@contextmanager
def _giving_up_lock_waits(conn: Connection, ddl: HistoryPartitions, what: str) -> Iterator[None]:
    """Limit the lock waits of the rest of the caller's transaction, and turn a wait given up
    into :class:`HistoryBusy` (the transaction then rolls back whole)."""
    ddl.limit_lock_waits(conn)
    try:
        yield
    except sa_exc.DBAPIError as error:
        if not ddl.is_lock_timeout(error):
            raise
        raise HistoryBusy(
            f"{what} waited {LOCK_TIMEOUT_MS} ms for a lock on the history (a long reader of "
            f"it?): it tries again at the next pass"
        ) from error


def _mark() -> ColumnElement[datetime]:
    return (
        select(count_marks.c.folded_until).where(count_marks.c.name == "finished").scalar_subquery()
    )


def movable(
    dialect: Dialect, *, after: float, keep: float | None, since: datetime | None = None
) -> list[ColumnElement[bool]]:
    """The jobs the mover may take: succeeded ``after`` seconds ago or more, counted, within
    retention (``keep`` seconds; ``None``: kept for ever), not before ``since`` (where a
    previous full pass reached), and bound to no key, batch or workflow."""
    mark = _mark()
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
    if since is not None:
        where.append(jobs.c.finished_at >= literal(since, UtcDateTime()))
    return where


def movable_until(conn: Connection, dialect: Dialect, *, after: float) -> datetime | None:
    """The end of what the mover may take now (``after`` seconds ago, or the counts' mark if
    earlier); ``None`` without a mark. A pass that moved everything movable before it leaves
    nothing older to move later: such a job's key, batch and status columns never change."""
    now_less_after, mark = conn.execute(select(dialect.now_plus(-float(after)), _mark())).one()
    return None if mark is None else min(now_less_after, mark)


def move_batch(
    conn: Connection,
    dialect: Dialect,
    *,
    after: float,
    keep: float | None,
    limit: int,
    since: datetime | None = None,
) -> int:
    """Move up to ``limit`` of the oldest movable jobs into the history; return how many moved
    (0: none is movable). The days they finished on get their partitions first (a day without
    a job gets an empty one, dropped with the others), so the move never meets a missing one."""
    ddl = history_partitions_of(dialect)
    if ddl is None:
        return 0
    with _giving_up_lock_waits(conn, ddl, "the move into the history"):
        return _move(conn, dialect, ddl, after=after, keep=keep, limit=limit, since=since)


def _move(
    conn: Connection,
    dialect: Dialect,
    ddl: HistoryPartitions,
    *,
    after: float,
    keep: float | None,
    limit: int,
    since: datetime | None,
) -> int:
    where = movable(dialect, after=after, keep=keep, since=since)
    first = select(jobs.c.finished_at).where(*where).order_by(jobs.c.finished_at).limit(limit)
    span = first.subquery()
    oldest, newest = conn.execute(
        select(func.min(span.c.finished_at), func.max(span.c.finished_at))
    ).one()
    if oldest is None:
        return 0
    days = _days(oldest, newest)
    if not _attached_days(ddl, conn).issuperset(days):
        ddl.lock_partition_creation(conn)  # then list again: another mover may have made them
        have = _attached_days(ddl, conn)
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


def _attached_days(ddl: HistoryPartitions, conn: Connection) -> set[date]:
    return {p.day for p in ddl.history_partitions(conn) if p.attached}


def _days(oldest: datetime, newest: datetime) -> list[date]:
    """Every UTC day from ``oldest``'s to ``newest``'s."""
    first, last = oldest.astimezone(UTC).date(), newest.astimezone(UTC).date()
    return [first + timedelta(days=n) for n in range((last - first).days + 1)]


def drop_days(conn: Connection, dialect: Dialect, *, older_than: float) -> int:
    """Drop the days of the history that ended more than ``older_than`` seconds ago (database
    clock), in the caller's transaction; return how many jobs went.

    A handful of statements however many days: under the counts' mark's lock (as a prune
    batch) and the parent's SHARE ROW EXCLUSIVE lock (a move under way commits first, no other
    starts, readers go on), the days are listed, the counted jobs of those days come off the
    rollup, their tags and actions are deleted (each read through the parent, which prunes to
    exactly those days: every job that finished before the end of the last of them is in one
    of them), then one ``DROP TABLE`` drops them all. Listing after the locks is what makes
    the count exact: no move adds a job to a day after it was counted, and no day attached
    meanwhile is counted but left. The exclusive lock the drop takes on the parent is held to
    the commit, and all of it commits, or none (nothing is ever subtracted twice)."""
    ddl = history_partitions_of(dialect)
    if ddl is None:
        return 0
    cutoff: datetime = conn.execute(select(dialect.now_plus(-float(older_than)))).scalar_one()
    if not _expired(ddl, conn, cutoff):  # most passes: no lock taken at all
        return 0
    with _giving_up_lock_waits(conn, ddl, "the drop of the history's days"):
        mark = counts.lock_for_prune(conn, dialect)
        ddl.lock_history_against_moves(conn)
        expired = _expired(ddl, conn, cutoff)
        if not expired:
            return 0
        return _drop(conn, ddl, expired, mark)


def _expired(ddl: HistoryPartitions, conn: Connection, cutoff: datetime) -> list[HistoryPartition]:
    return [p for p in ddl.history_partitions(conn) if p.attached and p.ends <= cutoff]


def _drop(
    conn: Connection, ddl: HistoryPartitions, expired: list[HistoryPartition], mark: datetime
) -> int:
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
