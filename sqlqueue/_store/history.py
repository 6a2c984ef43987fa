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
``SKIP LOCKED``, so it never waits on a worker. It moves one day at a time and creates that
day's partition first (``CREATE TABLE`` then ``ATTACH PARTITION``: claims never read the
history, so nothing they do waits on it). Reads that may meet a finished job read both tables
(:mod:`sqlqueue._store.readable`).

**Retention.** A day whose end is older than the succeeded retention is detached
(``CONCURRENTLY``: readers of the other days never wait) and then, in one transaction, its jobs
come off the counts' rollup, their tags and operators' actions are deleted, and its table is
dropped: a crash in between leaves a detached table that the next pass finishes, and never
subtracts twice. A succeeded job is so kept for its retention and at most a day more.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    DateTime,
    Engine,
    MetaData,
    String,
    Table,
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
from sqlqueue.dialects import Dialect
from sqlqueue.dialects._history import HistoryPartition, history_partitions_of

__all__ = ["DroppedDay", "drop_day", "droppable_days", "movable", "move_batch"]

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
    """Move up to ``limit`` of the oldest movable jobs, all of one UTC day, into the history
    (creating that day's partition first); return how many moved (0: none is movable)."""
    ddl = history_partitions_of(dialect)
    if ddl is None:
        return 0
    where = movable(dialect, after=after, keep=keep)
    oldest: datetime | None = conn.execute(
        select(jobs.c.finished_at).where(*where).order_by(jobs.c.finished_at).limit(1)
    ).scalar_one_or_none()
    if oldest is None:
        return 0
    day = oldest.astimezone(UTC).date()
    if not any(p.day == day and p.attached for p in ddl.history_partitions(conn)):
        ddl.create_history_partition(conn, day)
    start = datetime(day.year, day.month, day.day, tzinfo=UTC)
    chosen = dialect.skip_locked(
        select(jobs.c.id)
        .where(
            *where,
            jobs.c.finished_at >= literal(start, UtcDateTime()),
            jobs.c.finished_at < literal(start + timedelta(days=1), UtcDateTime()),
        )
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


def droppable_days(conn: Connection, dialect: Dialect, *, older_than: float) -> list[date]:
    """The days whose partitions retention drops now: those that ended more than
    ``older_than`` seconds ago (database clock), and any detached one left by an interrupted
    pass."""
    ddl = history_partitions_of(dialect)
    if ddl is None:
        return []
    cutoff: datetime = conn.execute(select(dialect.now_plus(-float(older_than)))).scalar_one()
    return [
        partition.day
        for partition in ddl.history_partitions(conn)
        if not partition.attached or partition.ends <= cutoff
    ]


@dataclass(frozen=True, kw_only=True)
class DroppedDay:
    """What dropping one day did: its jobs, and how many the rollup had counted."""

    day: date
    jobs: int


def detach_day(engine: Engine, dialect: Dialect, day: date) -> HistoryPartition | None:
    """Detach ``day``'s partition from the parent, outside any transaction (a concurrent
    detach must be); return it as it is now, or ``None`` if it is gone already."""
    ddl = history_partitions_of(dialect)
    if ddl is None:
        return None
    with engine.connect() as conn:
        conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        found = [p for p in ddl.history_partitions(conn) if p.day == day]
        if not found:
            return None
        if found[0].attached:
            ddl.detach_history_partition(conn, found[0])
        return HistoryPartition(name=found[0].name, day=day, attached=False)


def drop_day(conn: Connection, dialect: Dialect, partition: HistoryPartition) -> DroppedDay:
    """Drop a detached day: take its counted jobs off the rollup, delete its jobs' tags and
    actions, and drop its table, all in the caller's transaction (under the counts' mark's
    lock, as a prune batch is)."""
    ddl = history_partitions_of(dialect)
    if ddl is None or partition.attached:
        raise ValueError(f"{partition.name} is not a detached day of the history")
    mark = counts.lock_for_prune(conn, dialect)
    day = _day_table(partition.name)
    counted = (day.c.finished_at < literal(mark, UtcDateTime())).label("counted")
    total = 0
    rollup: Counter[tuple[str, str, str]] = Counter()
    for status, queue, job_type, was_counted, n in conn.execute(
        select(day.c.status, day.c.queue, day.c.job_type, counted, func.count()).group_by(
            day.c.status, day.c.queue, day.c.job_type, counted
        )
    ):
        total += int(n)
        if was_counted:
            rollup[(status, queue, job_type)] += int(n)
    counts.subtract_counted(conn, rollup)
    conn.execute(delete(job_tags).where(job_tags.c.job_id.in_(select(day.c.id))))
    conn.execute(delete(job_actions).where(job_actions.c.job_id.in_(select(day.c.id))))
    ddl.drop_history_table(conn, partition)
    return DroppedDay(day=partition.day, jobs=total)


def _day_table(name: str) -> Table:
    """The columns a drop reads of a detached day's table (declared without a schema, so the
    connection's schema translation applies as to every sqlqueue table)."""
    return Table(
        name,
        MetaData(),
        Column("id", BigInteger),
        Column("status", String),
        Column("queue", String),
        Column("job_type", String),
        Column("finished_at", DateTime(timezone=True)),
    )
