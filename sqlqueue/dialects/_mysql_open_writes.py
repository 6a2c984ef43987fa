"""When the oldest open writing transaction on MariaDB/MySQL began, read from InnoDB.

``information_schema.innodb_trx`` is not a live view: InnoDB serves it from a copy that it
refreshes only when nobody has read it for 0.1 s. Anything that polls it faster (several
folds, a monitoring tool, parallel tests) keeps that copy as it was, for as long as the polls
go on, and a write begun since is missing from it; a fold that trusted it then moved its mark
past a cancel still open and lost those jobs from the counts for good.

So the reading proves itself fresh: the fold's own transaction has locked the mark's row
before it asks, and only a copy that lists that transaction was taken after it began. The
transaction, not just the session: a pooled session's *earlier* transaction may be in a
stale copy under the same thread id, and trusting that copy lost a cancel still open (seen
under a loaded, randomly ordered suite). So each lookup reads with a statement that carries a
nonce of its own, and the copy must show this session executing that very statement
(``trx_query``), which it can only if it was taken during one of these reads. A copy without
it is read again after the idle time; when the copy stays stale, the answer is a time no open
write can be older than: the oldest other writer it lists, else the latest start it lists
(every transaction begun since is younger), or, where it lists none, no time at all that a
fold may pass.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import (
    BigInteger,
    Connection,
    Select,
    String,
    and_,
    case,
    column,
    func,
    literal,
    literal_column,
    select,
    table,
)

from sqlqueue._types import UtcDateTime

__all__ = ["EARLIEST", "oldest_open_write", "read_copy"]

#: How long nobody may read ``innodb_trx`` before InnoDB refreshes its copy (InnoDB's
#: ``CACHE_MIN_IDLE_TIME``), and a little more, so that our next read finds it refreshable.
_IDLE = 0.12
#: Reads of a stale copy before the fold settles for the cautious answer.
_READS = 4
#: ``trx_started`` has whole seconds: a transaction may have begun up to a second before it.
_ROUNDING = timedelta(seconds=1)
#: The answer when nothing can be said: earlier than any mark, so the fold moves nothing.
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class _Copy:
    """What one read of InnoDB's copy said."""

    fresh: bool  # it lists the reader's own transaction, so it was taken after that began
    oldest_write: datetime | None  # start of the oldest other writer in this database
    latest_start: datetime | None  # start of the youngest transaction of any session


def oldest_open_write(conn: Connection) -> datetime | None:
    """The start of the oldest other transaction of a session using this database that has
    changed or locked rows, a second early; ``None`` when there is none. ``conn``'s
    transaction must hold a row lock already (it is how a fresh copy is told from a stale
    one); when no fresh copy comes, the cautious bound of the module docstring."""
    nonce = secrets.token_hex(8)
    copy = read_copy(conn, nonce)
    for _ in range(_READS - 1):
        if copy.fresh:
            break
        time.sleep(_IDLE)
        copy = read_copy(conn, nonce)
    if copy.fresh:
        return copy.oldest_write
    if copy.oldest_write is not None:
        return copy.oldest_write
    return copy.latest_start if copy.latest_start is not None else EARLIEST


def read_copy(conn: Connection, nonce: str | None = None) -> _Copy:
    """One read of InnoDB's copy (see the module docstring), by a statement that carries
    ``nonce`` (a new one by default)."""
    row = conn.execute(select_open_writes(nonce or secrets.token_hex(8))).one()
    now: datetime = row.now

    def started(age: int | None) -> datetime | None:
        if age is None:
            return None
        return now - timedelta(microseconds=int(age)) - _ROUNDING

    return _Copy(
        fresh=bool(row.ours),
        oldest_write=started(row.oldest_write_age),
        latest_start=started(row.latest_start_age),
    )


def select_open_writes(nonce: str) -> Select[Any]:
    """One row from ``innodb_trx``: the database's UTC clock, whether the copy shows this
    session executing this statement (whose text carries ``nonce``: PyMySQL writes bound
    values into the text, and the nonce comes first so that the server's 1,024 characters of
    ``trx_query`` keep it), and the ages in microseconds of the oldest other writer of this
    database and of the youngest transaction of all. ``trx_started`` is in the server's time
    zone, so ages are measured against ``NOW()`` and later moved onto the UTC clock.

    Sessions of other databases are left out of the writers, as on PostgreSQL: their writes
    cannot land in our tables, and a busy neighbour held the counts back."""
    trx = table(
        "innodb_trx",
        column("trx_started"),
        column("trx_mysql_thread_id"),
        column("trx_rows_modified"),
        column("trx_rows_locked"),
        column("trx_query"),
        schema="information_schema",
    )
    sessions = table("processlist", column("id"), column("db"), schema="information_schema")
    probe = literal(nonce, String())
    # Two-valued, so that ``~ours`` below is true, not NULL, for this session's other
    # transaction of a stale copy (its ``trx_query`` NULL between statements): that one
    # counts as another writer, an earlier bound than none.
    ours = and_(
        trx.c.trx_mysql_thread_id == func.connection_id(),
        func.coalesce(func.locate(probe, trx.c.trx_query), 0) > 0,
    )
    writer = and_(
        ~ours,
        trx.c.trx_mysql_thread_id.in_(
            select(sessions.c.id).where(sessions.c.db == func.database())
        ),
        (trx.c.trx_rows_modified > 0) | (trx.c.trx_rows_locked > 0),
    )
    now = func.now(literal_column("6"))
    age = func.timestampdiff(
        literal_column("MICROSECOND"), trx.c.trx_started, now, type_=BigInteger()
    )
    return select(
        probe.label("probe"),
        func.utc_timestamp(literal_column("6"), type_=UtcDateTime()).label("now"),
        func.coalesce(func.max(case((ours, 1), else_=0)), 0).label("ours"),
        func.max(case((writer, age))).label("oldest_write_age"),
        func.min(age).label("latest_start_age"),
    ).select_from(trx)
