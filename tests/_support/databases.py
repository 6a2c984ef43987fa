"""Cheap set-up for the conformance suite: migrate once per test worker and backend, then clean
between tests.

A server database (PostgreSQL, MariaDB) is migrated when a test worker first needs it. Before
each later test, :meth:`ServerSchema.prepare` drops the tables a test added (its app's ledger,
the history's day partitions), checks that sqlqueue's own tables still have the shape and the
alembic version that the migration gave them, and empties them with their ids reset. A test
that changed sqlqueue's schema (a downgrade, a dropped index) is detected by that check, and
the next test gets a database rebuilt from scratch, as every test did before. SQLite copies a
migrated template file instead.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

import sqlalchemy as sa

import sqlqueue

#: The table alembic keeps sqlqueue's schema version in: never emptied.
VERSION_TABLE = "sqlqueue_alembic_version"

_POSTGRES_TABLES = (
    "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p', 'v', 'm')"
)
#: Everything about the tables left in the schema that a test could change: columns, indexes,
#: constraints, triggers, and the alembic version, as one digest.
_POSTGRES_SHAPE = """
SELECT md5(coalesce(string_agg(x, '|' ORDER BY x), '')) FROM (
    SELECT c.relname || '.' || a.attname || ':' || format_type(a.atttypid, a.atttypmod)
           || ':' || a.attnotnull::text || ':' || coalesce(pg_get_expr(d.adbin, d.adrelid), '')
           AS x
    FROM pg_attribute a
    JOIN pg_class c ON c.oid = a.attrelid
    JOIN pg_namespace n ON n.oid = c.relnamespace
    LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
    WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p') AND a.attnum > 0
      AND NOT a.attisdropped
    UNION ALL
    SELECT pg_get_indexdef(i.indexrelid)
    FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid
    JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = current_schema()
    UNION ALL
    SELECT co.conname || ':' || pg_get_constraintdef(co.oid)
    FROM pg_constraint co JOIN pg_namespace n ON n.oid = co.connamespace
    WHERE n.nspname = current_schema()
    UNION ALL
    SELECT t.tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
    JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = current_schema() AND NOT t.tgisinternal
    UNION ALL
    SELECT 'version:' || version_num FROM sqlqueue_alembic_version
) shape
"""

_MYSQL_TABLES = (
    "SELECT table_name, table_type FROM information_schema.tables WHERE table_schema = DATABASE()"
)
_MYSQL_SHAPE = """
SELECT md5(coalesce(group_concat(x ORDER BY x SEPARATOR '|'), '')) FROM (
    SELECT concat_ws(':', table_name, column_name, column_type, is_nullable,
                     coalesce(column_default, ''), coalesce(collation_name, ''), extra) AS x
    FROM information_schema.columns WHERE table_schema = DATABASE()
    UNION ALL
    SELECT concat_ws(':', table_name, index_name, seq_in_index, column_name, non_unique,
                     coalesce(sub_part, ''))
    FROM information_schema.statistics WHERE table_schema = DATABASE()
    UNION ALL
    SELECT concat('version:', version_num) FROM sqlqueue_alembic_version
) shape
"""


def copy_sqlite_template(template: Path, target: Path) -> None:
    """A migrated SQLite database at ``target``: a byte copy of the template file (whose
    write-ahead log was checkpointed into it when its last connection closed)."""
    shutil.copyfile(template, target)


def migrated_sqlite_template(path: Path) -> Path:
    """Migrate a new SQLite file at ``path`` once, for :func:`copy_sqlite_template`."""
    engine = sa.create_engine(f"sqlite:///{path}")
    try:
        sqlqueue.migrate(engine)
    finally:
        engine.dispose()
    leftovers = [p for p in path.parent.iterdir() if p.name.startswith(f"{path.name}-")]
    assert not leftovers, f"the template's journal was not checkpointed: {leftovers}"
    return path


@dataclass
class ServerSchema:
    """One server database of a test worker: migrated once, emptied before every test, and
    rebuilt only when a test changed sqlqueue's own schema."""

    url: str
    _tables: frozenset[str] = field(default=frozenset(), init=False)
    _counters: tuple[str, ...] = field(default=(), init=False)
    _shape: str = field(default="", init=False)
    _engine: sa.Engine | None = field(default=None, init=False)
    #: How many tests found the schema changed and rebuilt it (reported by the suite).
    rebuilds: int = field(default=0, init=False)

    def prepare(self) -> None:
        """Leave sqlqueue's tables migrated and empty, and nothing else in the database."""
        if self._engine is None:
            # One connection kept for the worker's whole session: a MariaDB connect costs
            # more than the cleaning itself. Pinged, as a fault test may restart the server.
            self._engine = sa.create_engine(self.url, pool_size=1, pool_pre_ping=True)
        with self._engine.connect() as conn:
            if self._tables and self._clean(conn):
                return
        self._rebuild(self._engine)

    def close(self) -> None:
        """Close the kept connection (before the database is dropped)."""
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None

    def _rebuild(self, engine: sa.Engine) -> None:
        if self._tables:
            self.rebuilds += 1
        with engine.begin() as conn:
            drop_tables(conn)
        sqlqueue.migrate(engine)
        with engine.connect() as conn:
            self._tables = frozenset(_tables(conn))
            self._counters = tuple(sorted(_counted(conn)))
            self._shape = _shape(conn)
            conn.commit()

    def _clean(self, conn: sa.Connection) -> bool:
        """Drop what a test added and empty sqlqueue's tables; False when the schema itself
        changed (the caller rebuilds it)."""
        present = _tables(conn)
        if not self._tables <= present:
            conn.rollback()
            return False
        _drop(conn, sorted(present - self._tables))
        _drop_triggers(conn)
        try:
            shape = _shape(conn)
        except sa.exc.DBAPIError:
            conn.rollback()
            return False
        if shape != self._shape:
            conn.rollback()
            return False
        _empty(conn, sorted(self._tables - {VERSION_TABLE}), self._counters)
        conn.commit()
        return True


def _is_postgres(conn: sa.Connection) -> bool:
    return conn.dialect.name == "postgresql"


def _tables(conn: sa.Connection) -> set[str]:
    if _is_postgres(conn):
        return set(conn.exec_driver_sql(_POSTGRES_TABLES).scalars())
    return {name for name, _ in conn.exec_driver_sql(_MYSQL_TABLES).all()}


def _shape(conn: sa.Connection) -> str:
    sql = _POSTGRES_SHAPE if _is_postgres(conn) else _MYSQL_SHAPE
    return str(conn.exec_driver_sql(sql).scalar_one())


def _drop(conn: sa.Connection, names: list[str]) -> None:
    if not names:
        return
    if _is_postgres(conn):
        views = set(
            conn.exec_driver_sql(
                "SELECT relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = current_schema() AND relkind IN ('v', 'm')"
            ).scalars()
        )
        for name in names:
            kind = "VIEW" if name in views else "TABLE"
            conn.exec_driver_sql(f'DROP {kind} IF EXISTS "{name}" CASCADE')
        return
    views = {name for name, kind in conn.exec_driver_sql(_MYSQL_TABLES).all() if kind == "VIEW"}
    conn.exec_driver_sql("SET FOREIGN_KEY_CHECKS = 0")
    for name in names:
        kind = "VIEW" if name in views else "TABLE"
        conn.exec_driver_sql(f"DROP {kind} IF EXISTS `{name}`")
    conn.exec_driver_sql("SET FOREIGN_KEY_CHECKS = 1")


def _drop_triggers(conn: sa.Connection) -> None:
    """Drop the triggers a test put on sqlqueue's tables (the fault ledger's audit trigger):
    sqlqueue's migrations create none."""
    if _is_postgres(conn):
        found = conn.exec_driver_sql(
            "SELECT t.tgname, c.relname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = current_schema() AND NOT t.tgisinternal"
        ).all()
        for trigger, table in found:
            conn.exec_driver_sql(
                f"DROP TRIGGER IF EXISTS {_quote(conn, trigger)} ON {_quote(conn, table)}"
            )
        return
    names = conn.exec_driver_sql(
        "SELECT trigger_name FROM information_schema.triggers WHERE trigger_schema = DATABASE()"
    ).scalars()
    for name in list(names):
        conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS {_quote(conn, name)}")


def _counted(conn: sa.Connection) -> set[str]:
    """The tables with an id counter to reset: MariaDB's auto-increment tables, PostgreSQL's
    sequences."""
    if _is_postgres(conn):
        return set(
            conn.exec_driver_sql(
                "SELECT sequencename FROM pg_sequences WHERE schemaname = current_schema()"
            ).scalars()
        )
    return set(
        conn.exec_driver_sql(
            "SELECT table_name FROM information_schema.columns "
            "WHERE table_schema = DATABASE() AND extra LIKE '%%auto_increment%%'"
        ).scalars()
    )


def _quote(conn: sa.Connection, name: str) -> str:
    return conn.dialect.identifier_preparer.quote_identifier(name)


def _empty(conn: sa.Connection, names: list[str], counted: tuple[str, ...]) -> None:
    """Delete the rows of the tables that have any (a ``DELETE`` of an empty table, or a
    ``TRUNCATE``, costs a round trip or a file each: most tests touch few tables) and restart
    the id counters that moved. sqlqueue's tables have no foreign keys, so order is free."""
    probes = " UNION ALL ".join(
        f"SELECT {i} FROM (SELECT 1 AS x) one WHERE EXISTS (SELECT 1 FROM {_quote(conn, name)})"
        for i, name in enumerate(names)
    )
    for i in conn.exec_driver_sql(probes).scalars():
        conn.exec_driver_sql(f"DELETE FROM {_quote(conn, names[i])}")
    if not counted:
        return
    if _is_postgres(conn):
        conn.exec_driver_sql(
            "SELECT setval(format('%%I.%%I', schemaname, sequencename)::regclass, 1, false) "
            "FROM pg_sequences WHERE schemaname = current_schema() AND last_value IS NOT NULL"
        )
        return
    moved = conn.exec_driver_sql(
        "SELECT table_name FROM information_schema.tables "
        "WHERE table_schema = DATABASE() AND auto_increment > 1"
    ).scalars()
    for name in list(moved):
        if name in counted:
            conn.exec_driver_sql(f"ALTER TABLE {_quote(conn, name)} AUTO_INCREMENT = 1")


def drop_tables(conn: sa.Connection) -> None:
    """Drop every table and view of the current schema (PostgreSQL) or database (MariaDB)."""
    _drop(conn, sorted(_tables(conn)))
