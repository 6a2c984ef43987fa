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

from sqlalchemy import Connection, text

__all__ = ["HistoryPartition", "HistoryPartitions", "history_partitions_of"]

#: The parent table, and the prefix of its partitions' names.
PARENT = "sqlqueue_jobs_history"
PREFIX = PARENT + "_p"

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
        """Drop partitions' tables in one statement, in the caller's transaction. An attached
        one is detached by the drop itself, which takes ACCESS EXCLUSIVE on the parent until
        the commit: only readers of the history wait, never a claim, an enqueue or a
        completion (none of them reads it). ``DETACH … CONCURRENTLY`` first would wait for
        every older transaction twice per partition, and a statement per day costs the first
        prune of a year of history seconds (measured: bench/prune_history.py)."""
        if partitions:
            names = ", ".join(self._qualified(conn, p.name) for p in partitions)
            conn.execute(text(f"DROP TABLE {names}"))


def history_partitions_of(dialect: object) -> HistoryPartitions | None:
    """``dialect``'s partition DDL if its backend keeps the history table, else ``None``."""
    return dialect if isinstance(dialect, HistoryPartitions) else None
