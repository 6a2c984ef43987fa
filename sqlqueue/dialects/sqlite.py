"""SQLite: the embedded default for local development and single-host deployments.

Claims are an atomic ``UPDATE … WHERE id IN (SELECT … LIMIT n) RETURNING`` under
``BEGIN IMMEDIATE``; the file runs in WAL mode so readers never block the writer.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar

from sqlalchemy import (
    URL,
    Connection,
    Engine,
    Float,
    Integer,
    String,
    Table,
    Text,
    bindparam,
    cast,
    event,
    func,
    literal_column,
    select,
    tuple_,
    type_coerce,
)
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.sql.elements import ColumnElement

from sqlqueue._errors import ConfigurationError, UnsupportedDatabase
from sqlqueue._schema import jobs
from sqlqueue._types import UtcDateTime, as_utc
from sqlqueue.dialects._base import BulkPath, Dialect, is_borrowed
from sqlqueue.dialects._claiming import CLAIM_TIMESTAMPS, status_literal
from sqlqueue.dialects._claiming_by_type import ClaimingByType

__all__ = [
    "MIN_SQLITE_VERSION",
    "SQLiteDialect",
    "check_not_in_memory",
    "check_sqlite_json",
    "check_sqlite_version",
]

MIN_SQLITE_VERSION = (3, 35, 0)
#: Same text layout SQLAlchemy stores datetimes in, so the clock compares with stored values.
_CLOCK_FORMAT = "%Y-%m-%d %H:%M:%f000"
#: OperationalError texts that mean the file cannot be used right now (not a bad statement).
_OUTAGE_SIGNS = (
    "unable to open",
    "locked",
    "busy",
    "disk i/o error",
    "readonly",
    "disk is full",
    "not a database",
)
#: ``PRAGMA synchronous`` level NORMAL (FULL is 2, the sqlite3 module's default).
_NORMAL = 1
#: How long a connection waits for the write lock before reporting "database is locked".
BUSY_TIMEOUT_MS = 30_000


def check_sqlite_version(version: tuple[int, ...]) -> None:
    """Refuse SQLite builds without ``RETURNING``, saying which version is needed."""
    if tuple(version[:3]) < MIN_SQLITE_VERSION:
        have = ".".join(str(part) for part in version)
        raise UnsupportedDatabase(
            f"SQLite {have} has no RETURNING; sqlqueue needs SQLite >= 3.35 "
            "(upgrade Python, or install pysqlite3-binary and point SQLAlchemy at it)"
        )


def check_sqlite_json(driver: Any = sqlite3, connect: Any = None) -> None:
    """Refuse a SQLite built without its JSON functions (optional before 3.38), which the
    worker's completions and bulk enqueue use, saying so instead of failing mid-drain.
    ``driver`` is the DB-API module the engine uses (``sqlite3``, or e.g. ``pysqlite3``)."""
    probe = (connect or driver.connect)(":memory:")
    try:
        probe.execute("SELECT count(*) FROM json_each('[1]')").fetchone()
    except driver.DatabaseError as error:
        raise UnsupportedDatabase(
            f"this SQLite ({driver.sqlite_version}) lacks the JSON functions sqlqueue needs "
            f"({error}); use a build with JSON1 (SQLite >= 3.38 has it built in), e.g. "
            "install pysqlite3-binary and point SQLAlchemy at it"
        ) from None
    finally:
        probe.close()


def check_not_in_memory(url: URL) -> None:
    """Refuse an in-memory database (``sqlite://``, ``sqlite:///:memory:``, a ``file:`` URI
    with ``:memory:`` or ``mode=memory``): each connection, and so each worker, would get a
    private database of its own, where the jobs and even the tables are not."""
    database = url.database or ""
    query = " ".join(f"{key}={value}" for key, value in url.query.items())
    in_memory = database in ("", ":memory:") or (
        database.startswith("file:")
        and (database.startswith("file::memory:") or "mode=memory" in f"{database} {query}")
    )
    if in_memory:
        shown = f"{url.drivername}:///{database}" if database else f"{url.drivername}://"
        shown += f"?{query.replace(' ', '&')}" if query else ""
        raise ConfigurationError(
            f"{shown} is an in-memory SQLite database: each connection gets a "
            "private one of its own, so workers would not see the jobs (or the tables); use a "
            "file, e.g. sqlite:///jobs.db (sqlqueue's pytest fixtures use a temporary one)"
        )


def _configure_connection(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA journal_mode = WAL")
    finally:
        cursor.close()


def _driver_module(engine: Engine) -> Any:
    """The SQLite DB-API module behind ``engine``: its own for the synchronous drivers (the
    standard library's ``sqlite3``, or ``pysqlite3``), the standard library's under aiosqlite."""
    dbapi = getattr(engine.dialect, "dbapi", None)
    if engine.dialect.driver != "aiosqlite" and hasattr(dbapi, "sqlite_version_info"):
        return dbapi
    return sqlite3


def _pragma(conn: Connection, statement: str) -> Any:
    """Run a ``PRAGMA`` on the driver's own connection and return its first value: a relaxed
    write runs three, and through SQLAlchemy each cost more than a small claim's statement. On
    a driver error it runs again through SQLAlchemy, which raises the error in its own terms."""
    cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
    try:
        cursor.execute(statement)
        row = cursor.fetchone()
    except Exception:  # the driver's own error class: SQLAlchemy raises it in its own terms
        result = conn.exec_driver_sql(statement)
        row = result.first()
    finally:
        cursor.close()
    return None if row is None else row[0]


def _relaxed_level(conn: Connection) -> int | None:
    """Lower the connection to ``synchronous = NORMAL`` (outside a transaction, where SQLite
    allows it); return the level to restore, or ``None`` if it was NORMAL or lower already."""
    level = int(_pragma(conn, "PRAGMA synchronous"))
    if level <= _NORMAL:
        return None
    _pragma(conn, f"PRAGMA synchronous = {_NORMAL}")
    return level


def _restore_level(conn: Connection, level: int) -> None:
    """Put the connection's durability back before the pool hands it to anyone else."""
    try:
        if conn.connection.dbapi_connection is not None and getattr(
            conn.connection.dbapi_connection, "in_transaction", False
        ):
            conn.rollback()  # an error left the transaction open: SQLite refuses the pragma
        _pragma(conn, f"PRAGMA synchronous = {int(level)}")
    except Exception:
        conn.invalidate()  # never return a relaxed connection to the pool


def _fence_document(fences: Sequence[tuple[int, int]]) -> str:
    return json.dumps([[int(job_id), int(attempt)] for job_id, attempt in fences])


class SQLiteDialect(ClaimingByType, Dialect):
    """SQLite ≥ 3.35 through the standard library's ``sqlite3`` driver."""

    names: ClassVar[tuple[str, ...]] = ("sqlite",)
    supports_skip_locked: ClassVar[bool] = False
    #: The write lock serialises every writer: there is no row to wait on.
    supports_row_locks: ClassVar[bool] = False
    supports_pragmas: ClassVar[bool] = True
    supports_listen_notify: ClassVar[bool] = False
    supports_many_hosts: ClassVar[bool] = False
    single_writer: ClassVar[bool] = True
    bulk_path: ClassVar[BulkPath] = BulkPath.JSON_ARRAY

    def prepare_engine(self, engine: Engine) -> None:
        """Refuse an in-memory database, check the library version and put every new
        connection in WAL with a busy timeout."""
        check_not_in_memory(engine.url)
        driver = _driver_module(engine)
        check_sqlite_version(driver.sqlite_version_info)
        check_sqlite_json(driver)
        if not event.contains(engine, "connect", _configure_connection):
            event.listen(engine, "connect", _configure_connection)
            # Connections the app opened before (create_all, a first query) sit in the pool
            # without the busy timeout and would fail with "database is locked" under load:
            # close the idle ones, so every connection from now on is configured. (Checked-out
            # ones stay valid and are discarded when returned.)
            engine.dispose()

    def configure_database(self, dbapi_connection: Any) -> None:
        """WAL, as sqlqueue's own connections set it (the file keeps it): set when the tables
        are made, it is not first asked for by a connection of sqlqueue's while another holds
        a write transaction (the switch waits for every other one to end)."""
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute("PRAGMA journal_mode = WAL")
        finally:
            cursor.close()

    def url_problem(self, url: URL, *, lasting: bool = False) -> str | None:
        """A file in a directory that is not there: SQLite creates the file, never its
        directory, and says only "unable to open database file" (not ``lasting``: the
        directory may yet appear)."""
        database = url.database
        if lasting or not database or database == ":memory:" or database.startswith("file:"):
            return None
        directory = Path(database).parent
        if directory.is_dir():
            return None
        state = "is not a directory" if directory.exists() else "does not exist"
        return f"is a file in {str(directory)!r}, which {state}: create it, or fix the path"

    def missing_database(self, url: URL) -> str | None:
        """A file path that is not there: reading it must not create it empty."""
        database = url.database
        if not database or database == ":memory:" or database.startswith("file:"):
            return None
        return None if Path(database).exists() else f"there is no SQLite database at {database}"

    def check_same_database(self, home: Engine, other: Engine) -> None:
        """Refuse a connection to another SQLite file than the Queue's: a test that rebinds the
        app's Queue to its own file, handed the app's own engine, would write the job into
        the app's database and find none in its own."""
        mine, theirs = _file_of(home.url), _file_of(other.url)
        if mine is not None and theirs is not None and mine != theirs:
            raise ConfigurationError(
                f"this Queue's database is the SQLite file {mine}, but the connection it was "
                f"given is to {theirs}: enqueue through a connection of the Queue's engine "
                "(in tests: sqlqueue_engine, the file the sqlqueue_queue fixture serves)"
            )

    def async_url(self, url: URL) -> URL:
        """The standard library driver's asyncio twin: aiosqlite."""
        return url.set(drivername="sqlite+aiosqlite")

    def begin_snapshot(self, conn: Connection) -> None:
        """A deferred ``BEGIN``: in WAL mode the first read fixes the snapshot for the whole
        transaction (the driver starts none for plain reads)."""
        if is_borrowed(conn):
            _begin_borrowed(conn)
        else:
            conn.exec_driver_sql("BEGIN")

    def begin_write(self, conn: Connection) -> None:
        """``BEGIN IMMEDIATE``: take the write lock now, so a later write cannot hit SQLITE_BUSY."""
        if is_borrowed(conn):
            _begin_borrowed(conn)
        else:
            conn.exec_driver_sql("BEGIN IMMEDIATE")

    @contextmanager
    def write_transaction(self, conn: Connection, *, relaxed: bool = False) -> Iterator[None]:
        """``BEGIN IMMEDIATE``; ``relaxed`` runs it at ``synchronous = NORMAL``: in WAL mode the
        commit then skips its fsync (~0.2 ms here), and a power loss may undo the latest such
        commits but never corrupts the file. The connection's own level is put back after."""
        # A borrowed connection's session is its owner's (and PRAGMA synchronous cannot
        # change inside the transaction it is in).
        level = _relaxed_level(conn) if relaxed and not is_borrowed(conn) else None
        try:
            self.begin_write(conn)
            yield
        finally:
            if level is not None:
                _restore_level(conn, level)

    def clock(self) -> ColumnElement[datetime]:
        """Millisecond UTC time, fixed for the whole statement by SQLite."""
        return func.strftime(_CLOCK_FORMAT, "now", type_=UtcDateTime())

    def clock_plus(self, seconds: ColumnElement[float]) -> ColumnElement[datetime]:
        """SQLite date modifiers take fractional seconds: ``'+12.500000 seconds'``."""
        return func.strftime(
            _CLOCK_FORMAT, "now", func.printf("%+.6f seconds", seconds), type_=UtcDateTime()
        )

    def seconds_between(
        self, later: ColumnElement[datetime], earlier: ColumnElement[datetime]
    ) -> ColumnElement[float]:
        """The Julian-day difference in seconds, rounded to the millisecond: SQLite times carry
        milliseconds, and the rounding removes the double's error (about 10 µs) from them."""
        days = func.julianday(later) - func.julianday(earlier)
        return func.round(days * 86_400.0, 3, type_=Float())

    def minutes_between(
        self, later: ColumnElement[datetime], earlier: ColumnElement[datetime]
    ) -> ColumnElement[int]:
        """Truncated by a cast: ``floor`` exists only where SQLite was built with its math
        functions (the buckets are never negative, where the two agree)."""
        days = func.julianday(later) - func.julianday(earlier)
        return cast(days * 1440.0, Integer())

    def holds_lease(
        self, worker_id: Any, fences: Sequence[tuple[int, int]] | None = None
    ) -> list[ColumnElement[bool]]:
        """The fences travel as one JSON array of ``[id, attempt]`` pairs, unpacked with
        ``json_each``: one parameter for any number of them, where an expanding ``IN`` list
        re-rendered the statement with 200 placeholders on every completion of 100 jobs."""
        document: Any = (
            bindparam("fences", type_=String())
            if fences is None
            else bindparam(None, _fence_document(fences), type_=String())
        )
        pairs = func.json_each(document).table_valued("value")
        job_id = func.json_extract(pairs.c.value, "$[0]")
        return [
            jobs.c.id.in_(select(job_id)),  # the primary key: index lookups
            func.likely(jobs.c.status == status_literal("running")),
            jobs.c.locked_by == worker_id,
            tuple_(jobs.c.id, jobs.c.attempts).in_(
                select(job_id, func.json_extract(pairs.c.value, "$[1]"))
            ),
        ]

    def selective(self, condition: ColumnElement[bool]) -> ColumnElement[bool]:
        """``likelihood(condition, 0.001)``: without it SQLite counts recently finished jobs by
        walking every finished job in ``ix_sqlqueue_jobs_status`` (its order saves a sort),
        not the short range of ``ix_sqlqueue_jobs_finished``."""
        likely: ColumnElement[bool] = func.likelihood(condition, literal_column("0.001"))
        return likely

    def fence_parameters(self, fences: Sequence[tuple[int, int]]) -> dict[str, Any]:
        """The JSON array of ``holds_lease(…, fences=None)``."""
        return {"fences": _fence_document(fences)}

    def _claim_column(self, column: ColumnElement[Any]) -> ColumnElement[Any]:
        """Timestamps come back as their stored text too: through the column type, each was a
        regular-expression parse (three per job)."""
        if column.name in CLAIM_TIMESTAMPS:
            return type_coerce(column, Text()).label(column.name)
        return super()._claim_column(column)

    def claim_moment(self, value: Any) -> datetime:
        """A stored timestamp (``YYYY-MM-DD HH:MM:SS.ffffff``, UTC), as :meth:`claim_returning`
        returns it, as an aware datetime (a datetime already, from a connection that parses
        declared ``DATETIME`` columns itself: Django's, lent to sqlqueue in a test)."""
        return as_utc(value if isinstance(value, datetime) else datetime.fromisoformat(value))

    def conflict_insert(self, table: Table) -> Any:
        """This backend's INSERT construct (``ON CONFLICT`` support)."""
        return sqlite_insert(table)

    def _is_missing_table(self, error: sa_exc.DBAPIError) -> bool:
        return "no such table" in str(error.orig)

    def _is_unavailable(self, error: sa_exc.DBAPIError) -> bool:
        """SQLite raises OperationalError for SQL mistakes too: only these mean an outage."""
        text = str(error.orig).lower()
        return isinstance(error, sa_exc.OperationalError) and any(
            sign in text for sign in _OUTAGE_SIGNS
        )

    def _unavailable_message(self, error: sa_exc.DBAPIError) -> str:
        text = str(error.orig).strip()
        if "locked" in text or "busy" in text:
            return (
                f"the SQLite database stayed locked by another writer for more than "
                f"{BUSY_TIMEOUT_MS // 1000} s ({text})"
            )
        return f"cannot open the SQLite database: {text}"

    # -- enqueue in bulk (added for issue 4) ---------------------------------------------------

    def json_array_rows(self, document: ColumnElement[str]) -> Any:
        """``json_each(document)``: its ``key`` is the element's position."""
        return func.json_each(document).table_valued("key", "value")

    def json_element(self, array: ColumnElement[Any], index: int, type_: Any) -> ColumnElement[Any]:
        """``json_extract(array, '$[index]')``."""
        element: ColumnElement[Any] = func.json_extract(array, f"$[{index}]", type_=type_)
        return element


def _begin_borrowed(conn: Connection) -> None:
    """The borrowed connection's own kind of transaction (its engine's ``begin``), where this
    dialect would otherwise send its ``BEGIN``."""
    if not conn.in_transaction():
        conn.begin()


def _file_of(url: URL) -> str | None:
    """The real path of the SQLite file ``url`` names; ``None`` for an in-memory database, a
    ``file:`` URI or an engine built by a ``creator`` (no file in its URL)."""
    database = url.database
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    return os.path.realpath(database)  # a relative path: from here, as the driver opens it
