"""PostgreSQL's day partitions of the finished history (``sqlqueue_jobs_history``): how they are
named, found, created and dropped. The store decides when (``_store/history.py``).

A partition holds the jobs that finished on one UTC day, ``[day, day + 1)``, and is named after
it (``sqlqueue_jobs_history_p20261201``), so its range is read from its name and the catalog is
asked only which of those tables are attached. Partition DDL cannot bind its names or bounds:
both are built here from a ``date`` (digits only), never from outside text.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import ClassVar

from sqlalchemy import Connection, func, select, text
from sqlalchemy import exc as sa_exc

__all__ = [
    "LOCK_TIMEOUT_MS",
    "HistoryPartition",
    "HistoryPartitions",
    "history_partitions_of",
]

#: The parent table, and the prefix of its partitions' names.
PARENT = "sqlqueue_jobs_history"
PREFIX = PARENT + "_p"

#: How long the mover's and the drop's statements wait for a table lock (a pg_dump, a report
#: reading the history) before giving up this pass: they run on the duty worker's only
#: database thread, whose claims and heartbeats must not stall behind a long reader.
LOCK_TIMEOUT_MS = 2000

#: lock_not_available: a lock wait ran past ``lock_timeout`` (or a ``NOWAIT`` met a lock).
_LOCK_NOT_AVAILABLE = "55P03"

#: Arbitrary but fixed: the advisory lock key under which movers create partitions, one at a
#: time (two movers creating the same day would otherwise clash on CREATE or ATTACH).
_PARTITION_LOCK_KEY = 0x5371_4869_7374

#: sqlqueue's partitions in the tables' schema: each one's name, and whether it is attached.
_FIND = text(
    "SELECT c.relname, i.inhrelid IS NOT NULL AS attached "
    "FROM pg_class c "
    "JOIN pg_namespace n ON n.oid = c.relnamespace "
    "LEFT JOIN pg_inherits i ON i.inhrelid = c.oid "
    "WHERE n.nspname = coalesce(:schema, current_schema()) AND c.relkind = 'r' "
    "AND c.relname LIKE :pattern ORDER BY c.relname"
)


@dataclass(frozen=True, kw_only=True)
class HistoryPartition:
    """One day partition: its table's name, its day, and whether it hangs off the parent."""

    name: str
    day: date
    attached: bool

    @property
    def ends(self) -> datetime:
        """The end of its range (exclusive): midnight UTC after its day."""
        return datetime.combine(self.day + timedelta(days=1), time(), tzinfo=UTC)


def partition_name(day: date) -> str:
    """The name of ``day``'s partition."""
    return f"{PREFIX}{day:%Y%m%d}"


class HistoryPartitions:
    """The partition DDL, mixed into the dialect of a backend that has the history table."""

    supports_history_partitions: ClassVar[bool] = True
    schema: str | None

    def _qualified(self, conn: Connection, name: str) -> str:
        quote = conn.dialect.identifier_preparer.quote_identifier
        return quote(name) if self.schema is None else f"{quote(self.schema)}.{quote(name)}"

    def history_partitions(self, conn: Connection) -> list[HistoryPartition]:
        """sqlqueue's day partitions, oldest first (and any of their tables detached by hand,
        ``attached`` false: retention leaves those alone)."""
        rows = conn.execute(_FIND, {"schema": self.schema, "pattern": PREFIX + "%"}).all()
        found = []
        for name, attached in rows:
            digits = str(name).removeprefix(PREFIX)
            if len(digits) != 8 or not digits.isdigit():
                continue
            day = datetime.strptime(digits, "%Y%m%d").replace(tzinfo=UTC).date()
            found.append(HistoryPartition(name=str(name), day=day, attached=bool(attached)))
        return found

    def limit_lock_waits(self, conn: Connection) -> None:
        """Make the rest of the caller's transaction give up a lock wait after
        :data:`LOCK_TIMEOUT_MS` (``SET LOCAL``: the setting ends with the transaction)."""
        conn.execute(select(func.set_config("lock_timeout", f"{LOCK_TIMEOUT_MS}ms", True)))

    @staticmethod
    def is_lock_timeout(error: BaseException) -> bool:
        """Whether ``error`` is the server giving up a lock wait (SQLSTATE 55P03)."""
        return (
            isinstance(error, sa_exc.DBAPIError)
            and getattr(error.orig, "sqlstate", None) == _LOCK_NOT_AVAILABLE
        )

    def lock_history_against_moves(self, conn: Connection) -> None:
        """Lock the history's parent until the commit in SHARE ROW EXCLUSIVE mode: it waits for
        a move under way to commit and keeps any other from starting (a move's INSERT takes ROW
        EXCLUSIVE, its ATTACH SHARE UPDATE EXCLUSIVE), but not readers of the history."""
        parent = self._qualified(conn, PARENT)
        conn.execute(text(f"LOCK TABLE {parent} IN SHARE ROW EXCLUSIVE MODE"))

    def lock_partition_creation(self, conn: Connection) -> None:
        """Take the transaction-scoped advisory lock under which partitions are created, so
        two movers never race on the same CREATE or ATTACH (list them again after it)."""
        conn.execute(select(func.pg_advisory_xact_lock(_PARTITION_LOCK_KEY)))

    def create_history_partition(self, conn: Connection, day: date) -> None:
        """Create ``day``'s partition and attach it: the attach takes only SHARE UPDATE
        EXCLUSIVE on the parent (no claim reads the history), and checks an empty table."""
        start = datetime.combine(day, time(), tzinfo=UTC)
        end = start + timedelta(days=1)
        name = self._qualified(conn, partition_name(day))
        parent = self._qualified(conn, PARENT)
        conn.execute(text(f"CREATE TABLE {name} (LIKE {parent} INCLUDING DEFAULTS)"))
        conn.execute(
            text(
                f"ALTER TABLE {parent} ATTACH PARTITION {name} FOR VALUES "
                f"FROM ('{start.isoformat()}') TO ('{end.isoformat()}')"
            )
        )

    def drop_history_tables(self, conn: Connection, partitions: list[HistoryPartition]) -> None:
        """Drop partitions' tables in one statement, in the caller's transaction (``IF
        EXISTS``: one dropped by hand meanwhile is no error). An attached
        one is detached by the drop itself, which takes ACCESS EXCLUSIVE on the parent until
        the commit: it waits for the readers of the history (up to :data:`LOCK_TIMEOUT_MS`
        when the caller set :meth:`limit_lock_waits`), and later ones wait for its commit;
        never a claim, an enqueue or a completion (none of them reads it). ``DETACH …
        CONCURRENTLY`` first would wait for every older transaction twice per partition, and a
        statement per day costs the first prune of a year of history seconds (measured:
        bench/prune_history.py)."""
        if partitions:
            names = ", ".join(self._qualified(conn, p.name) for p in partitions)
            conn.execute(text(f"DROP TABLE IF EXISTS {names}"))


def history_partitions_of(dialect: object) -> HistoryPartitions | None:
    """``dialect``'s partition DDL if its backend keeps the history table, else ``None``."""
    return dialect if isinstance(dialect, HistoryPartitions) else None
