"""The dialect seam: the only place where sqlqueue's backends differ.

A :class:`Dialect` owns the database clock (and arithmetic on it: ``_clock.py``), the claim
statement and the lease fence (``_claiming.py``), conflict-ignoring inserts and upserts,
connection setup, capability flags and the translation of driver errors into sqlqueue's
hierarchy. The base classes hold the portable versions; backends override only what differs.

Dialects sit below the store: they import nothing of sqlqueue but ``_schema``, ``_types`` and
``_errors``. They say what their database can do (:attr:`Dialect.bulk_path`) and how (statement
builders); the store decides when, and turns rows into sqlqueue's values.
"""

from __future__ import annotations

import abc
import enum
import hashlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from sqlalchemy import (
    URL,
    Connection,
    Engine,
    Insert,
    Result,
    Select,
    Table,
    event,
)
from sqlalchemy import exc as sa_exc
from sqlalchemy.sql.elements import ColumnElement

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

from sqlqueue._errors import (
    ConfigurationError,
    DatabaseError,
    DatabaseRefused,
    DatabaseUnavailable,
    SchemaNotMigrated,
    SqlqueueError,
    UnsupportedDatabase,
)
from sqlqueue._schema import jobs, table_options
from sqlqueue.dialects._claiming import (
    Claiming,
)

__all__ = [
    "BORROWED",
    "WAKE_CHANNEL",
    "BulkPath",
    "Dialect",
    "is_borrowed",
    "wake_channel",
]

T = TypeVar("T")

#: The notification channel that wakes sleeping workers; the payload is the queue name. The
#: workers of a queue in a named schema listen on a channel of that schema's own.
WAKE_CHANNEL = "sqlqueue"

#: The longest channel name PostgreSQL takes (NAMEDATALEN - 1 bytes).
_MAX_CHANNEL_BYTES = 63


#: The key in a pooled connection's ``info`` that marks it *borrowed*: its transactions are
#: its owner's (a framework's connection in a test, which begins, commits and rolls back as its
#: own code says), so a statement that would start a transaction or set its characteristics
#: (``BEGIN IMMEDIATE``, ``SET TRANSACTION``, a ``PRAGMA``) is left out and the transaction the
#: connection's engine begins (a savepoint, where the owner has one open) is what it gets.
BORROWED = "sqlqueue.borrowed"


def is_borrowed(conn: Connection) -> bool:
    """Whether ``conn`` runs on a borrowed connection (see :data:`BORROWED`)."""
    return bool(conn.info.get(BORROWED))


def _mark_borrowed(dbapi_connection: Any, record: Any) -> None:
    record.info[BORROWED] = True


class BulkPath(enum.Enum):
    """How a backend writes thousands of job rows fastest (the store's ``insert_rows``)."""

    #: Multi-row ``INSERT … RETURNING`` (SQLAlchemy's insertmanyvalues): any backend.
    INSERT = "insert"
    #: ``COPY … FROM STDIN`` with ids taken from the sequence first (see ``_store/bulk_copy.py``):
    #: needs :meth:`Dialect.copy_driver`, :meth:`Dialect.copy_rows` and the ``copy_*`` builders.
    COPY = "copy"
    #: One ``INSERT … SELECT … FROM`` a JSON array parameter per batch (``_store/bulk_json.py``):
    #: needs :meth:`Dialect.json_array_rows` and :meth:`Dialect.json_element`.
    JSON_ARRAY = "json_array"


def wake_channel(schema: str | None) -> str:
    """The wake-up channel of the queue whose tables are in ``schema``: workers of two schemas
    of one database do not wake each other. A name too long for a channel is hashed."""
    if schema is None:
        return WAKE_CHANNEL
    channel = f"{WAKE_CHANNEL}.{schema}"
    if len(channel.encode()) <= _MAX_CHANNEL_BYTES:
        return channel
    return f"{WAKE_CHANNEL}.{hashlib.sha256(schema.encode()).hexdigest()[:32]}"


class Dialect(Claiming):
    """Portable SQL for sqlqueue; subclasses override what their database does differently.

    An instance serves the sqlqueue tables of one schema: ``schema`` (``None``: the
    connection's default), where ``supports_schemas``.
    """

    #: The SQLAlchemy dialect names this class serves.
    names: ClassVar[tuple[str, ...]] = ()
    #: Other names a URL may give its database (SQLAlchemy knows them not), read as the
    #: first of ``names`` by ``with_driver``.
    url_aliases: ClassVar[tuple[str, ...]] = ()
    #: The driver a URL naming only the database (``mysql://``) gets, and the sqlqueue extra
    #: that installs it (``None``: the standard library's, no extra).
    driver: ClassVar[str | None] = None
    extra: ClassVar[str | None] = None
    #: ``SELECT … FOR UPDATE SKIP LOCKED`` is available.
    supports_skip_locked: ClassVar[bool] = False
    #: Transactions lock the rows they write, not the database: two can write at once and
    #: wait on each other row by row (so a set of rows must be locked in one order).
    supports_row_locks: ClassVar[bool] = False
    #: ``SET LOCAL``: a setting for one transaction, which its end undoes (``SHOW`` reads it).
    supports_transaction_settings: ClassVar[bool] = False
    #: Connection settings are read and written with ``PRAGMA`` statements.
    supports_pragmas: ClassVar[bool] = False
    #: The database can wake sleeping workers (LISTEN/NOTIFY).
    supports_listen_notify: ClassVar[bool] = False
    #: Several processes on several hosts can share the database.
    supports_many_hosts: ClassVar[bool] = True
    #: One writer at a time for the whole database: a long run of write transactions must
    #: leave gaps, or other processes waiting for the lock starve (SQLite's busy handler sleeps
    #: up to 100 ms between tries, so a back-to-back writer always wins).
    single_writer: ClassVar[bool] = False
    #: ``DELETE … WHERE id IN (SELECT id FROM the same table … LIMIT n)`` runs (MySQL refuses
    #: both the LIMIT in the subquery and reading the table a DELETE writes).
    deletes_by_limited_subquery: ClassVar[bool] = True
    #: Indexes can have a WHERE clause (elsewhere ``postgresql_where``/``sqlite_where`` are
    #: ignored and the index covers every row).
    supports_partial_indexes: ClassVar[bool] = True
    #: One transaction's commit can skip waiting for the disk (:meth:`relax_commit`).
    supports_relaxed_commit: ClassVar[bool] = True
    #: DDL runs inside transactions, so a failed migration rolls back whole.
    supports_transactional_ddl: ClassVar[bool] = True
    #: ``RETURNING`` and ``ON CONFLICT`` run as several statements (:meth:`execute_returning`),
    #: so statements using them must not be sent to the driver directly.
    emulates_returning: ClassVar[bool] = False
    #: ``WITH name AS (UPDATE … RETURNING …) UPDATE …``: one statement can write rows from
    #: another write's RETURNING (PostgreSQL), saving a round trip.
    supports_modifying_ctes: ClassVar[bool] = False
    #: The fastest way to write a batch of job rows.
    bulk_path: ClassVar[BulkPath] = BulkPath.INSERT
    #: sqlqueue's tables can live in a named schema of the database, apart from other queues'.
    supports_schemas: ClassVar[bool] = False
    #: The longest schema name the database takes, in bytes (UTF-8).
    max_schema_name: ClassVar[int] = 63
    #: A worker's claims start past the jobs it claimed before (``_store/claim_floor.py``):
    #: where dead row versions stay at the head of the claim index while a long transaction
    #: holds the horizon (PostgreSQL). Elsewhere every claim starts at the head of the index
    #: (SQLite leaves no dead versions in its indexes; MariaDB's InnoDB keeps delete-marked
    #: entries until purge, not measured yet: the plain claim).
    supports_claim_floor: ClassVar[bool] = False
    #: Succeeded jobs move from ``sqlqueue_jobs`` into ``sqlqueue_jobs_history``, partitioned
    #: by day, and retention drops whole days (``_store/history.py``; the partition DDL is in
    #: ``dialects/_history.py``). Elsewhere finished jobs stay where they ended and are pruned
    #: in batches.
    supports_history_partitions: ClassVar[bool] = False

    def __init__(self, schema: str | None = None) -> None:
        if schema is not None:
            self._check_schema(schema)
        self.schema = schema
        #: The execution options of every sqlqueue statement on a connection sqlqueue did not
        #: open itself (the caller's, a handler's transaction): see ``_schema.table_options``.
        self.table_options = table_options(schema)
        self.wake_channel = wake_channel(schema)
        #: How the app that built this dialect makes sqlqueue's tables, when that is not
        #: ``sqlqueue migrate`` (a framework's own command): what errors tell to run.
        self.migrated_by: str | None = None
        #: The engine of the Queue this dialect writes for (set when the Queue binds it):
        #: a connection from another engine may be to another database (``check_connection``).
        self.home: Engine | None = None

    def _check_schema(self, schema: object) -> None:
        if not self.supports_schemas:
            raise UnsupportedDatabase(
                f"schema={schema!r}: {type(self).__name__.removesuffix('Dialect')} has no "
                "schemas; give each queue a database of its own instead (leave schema unset)"
            )
        if not isinstance(schema, str) or not 0 < len(schema.encode()) <= self.max_schema_name:
            raise ConfigurationError(
                f"schema must be a name of 1..{self.max_schema_name} bytes, got {schema!r}"
            )

    def bind_tables(self, engine: Engine) -> Engine:
        """``engine`` for the connections sqlqueue opens itself: every statement on them runs
        against the tables in :attr:`schema` (the same engine when there is none)."""
        if not self.table_options:
            return engine
        return engine.execution_options(**self.table_options)

    def migrate_command(self) -> str:
        """The command that creates this dialect's tables, for error messages."""
        if self.migrated_by is not None:
            return self.migrated_by
        if self.schema is None:
            return "`sqlqueue migrate` (or sqlqueue.migrate(engine))"
        return (
            f"`sqlqueue migrate --schema {self.schema}` "
            f"(or sqlqueue.migrate(engine, schema={self.schema!r}))"
        )

    # -- connection setup -------------------------------------------------------------------

    def prepare_engine(self, engine: Engine) -> None:
        """Check the server and install per-connection settings; called once per engine."""

    def configure_database(self, dbapi_connection: Any) -> None:
        """Set, from a connection outside any transaction that sqlqueue did not configure (a
        framework's, migrating), what the database itself keeps for every later connection:
        nothing here (SQLite's journal mode)."""

    def borrow(self, engine: Engine) -> None:
        """Make ``engine``, whose one connection a framework lends to sqlqueue (a test's),
        work as sqlqueue's own engines do without touching the session: its connections are
        marked :data:`BORROWED` (instead of :meth:`prepare_engine`'s settings); a backend
        whose framework decodes some type otherwise puts sqlqueue's decoding back, for
        sqlqueue's statements only."""
        if not event.contains(engine, "connect", _mark_borrowed):
            event.listen(engine, "connect", _mark_borrowed)

    @contextmanager
    def migration_lock(self, conn: Connection) -> Iterator[None]:
        """Make concurrent ``migrate`` runs take turns: the block runs alone (the portable
        version needs nothing: a database-wide write lock, as SQLite's, serialises them)."""
        yield

    @contextmanager
    def migrating_in_schema(self, conn: Connection) -> Iterator[None]:
        """Make the migrations' statements on ``conn`` create and change the tables in
        :attr:`schema` for the block (only where ``supports_schemas``)."""
        if self.schema is not None:  # pragma: no cover - __init__ refused it
            raise UnsupportedDatabase(f"{type(self).__name__} has no schemas")
        yield

    @contextmanager
    def listen(self, engine: Engine, channel: str) -> Iterator[Callable[[float], Iterator[str]]]:
        """A dedicated connection listening on ``channel``; yields ``wait(timeout)``, which
        yields notification payloads as they arrive. Only where ``supports_listen_notify``."""
        raise NotImplementedError(f"{type(self).__name__} supports LISTEN/NOTIFY: define listen()")
        yield  # pragma: no cover

    def wake_columns(self) -> tuple[ColumnElement[Any], ...]:
        """Extra RETURNING columns of an enqueue INSERT that also wake sleeping workers."""
        return ()

    def notify_statement(self, payload: str) -> Select[Any] | None:
        """A statement that wakes listening workers with ``payload`` when the transaction
        commits, or ``None`` where the backend has no wake-ups (workers find out by polling)."""
        return None

    def relax_commit(self, conn: Connection) -> None:
        """Let this transaction's commit return before it reaches the disk, if supported."""

    def begin_write(self, conn: Connection) -> None:
        """Start a transaction that will write (SQLite takes the write lock up front)."""
        conn.begin()

    @contextmanager
    def write_transaction(self, conn: Connection, *, relaxed: bool = False) -> Iterator[None]:
        """A write transaction on ``conn`` for the block, which commits or rolls it back.

        ``relaxed``: the commit need not wait for the disk — for writes whose loss in a crash
        at-least-once absorbs (a job runs again).
        """
        self.begin_write(conn)
        if relaxed:
            self.relax_commit(conn)
        yield

    def retry_transaction(self, operation: Callable[[], T]) -> T:
        """Run ``operation``, a whole write transaction that rolls back when it raises; a
        backend whose server resolves lock conflicts by aborting a transaction (deadlock
        victims) runs it again."""
        return operation()

    @abc.abstractmethod
    def async_url(self, url: URL) -> URL:
        """The URL of the same database through this backend's asyncio driver."""

    # -- statements --------------------------------------------------------------------------

    def execute_returning(
        self,
        conn: Connection | Session,
        stmt: Any,
        params: Any = None,
        *,
        execution_options: Mapping[str, Any] | None = None,
    ) -> Result[*tuple[Any, ...]]:
        """Execute a statement with ``RETURNING``, or an :meth:`upsert`, and return its rows as
        ``RETURNING`` gives them. Backends without ``UPDATE … RETURNING`` or ``ON CONFLICT``
        emulate them here, in ``conn``'s transaction. ``execution_options``: for a connection
        sqlqueue did not open (the caller's), the :attr:`table_options` of its schema."""
        if execution_options:
            return conn.execute(stmt, params, execution_options=execution_options)
        return conn.execute(stmt, params)

    def check_connection(self, conn: Connection | Engine) -> None:
        """Refuse a connection to another kind of database than this dialect writes for (a
        Queue on PostgreSQL handed a SQLite test connection): its statements would fail there
        with errors that point elsewhere. Then :meth:`check_same_database`."""
        found = conn.dialect.name
        if found not in self.names:
            raise ConfigurationError(
                f"this Queue writes {self.names[0]} SQL, but the connection it was given is "
                f"to a {found} database: enqueue through a connection of the Queue's database, "
                "or build the Queue on this one (in tests: the sqlqueue_queue fixture's Queue "
                "and sqlqueue_engine)"
            )
        home = self.home
        engine = conn if isinstance(conn, Engine) else conn.engine
        if home is not None and engine is not home:
            self.check_same_database(home, engine)

    def check_same_database(self, home: Engine, other: Engine) -> None:
        """Refuse ``other`` where it is known to reach another database than ``home``, the
        Queue's engine (only where the URLs tell for sure: a SQLite file; a server's database
        can be reached by many names, a pooler's among them). Nothing here by default."""

    def url_problem(self, url: URL, *, lasting: bool = False) -> str | None:
        """What makes ``url`` unusable before anything is opened, said to follow the URL in
        one sentence with what to do (``"names no database: …"``); ``None`` if nothing. With
        ``lasting``, only what no wait cures (a worker started before its SQLite file's
        directory is mounted retries until it appears)."""
        return None

    def check_url(self, url: URL, *, lasting: bool = False) -> None:
        """Refuse ``url`` with :meth:`url_problem`'s sentence (password hidden) where it has
        one: a ``Queue`` (``lasting``) or ``migrate()`` given it would fail later, inside
        SQLAlchemy or the driver, with an error that does not name the URL (a bare
        ``AssertionError`` for a MySQL URL without a database)."""
        problem = self.url_problem(url, lasting=lasting)
        if problem is not None:
            shown = url.render_as_string(hide_password=True)
            raise ConfigurationError(f"database URL {shown!r} {problem}")

    def missing_database(self, url: URL) -> str | None:
        """Where ``url`` names a database that does not exist and opening it would create it
        empty (a SQLite file), say so; ``None`` otherwise (a server reports its own)."""
        return None

    def oldest_open_write(self, conn: Connection) -> datetime | None:
        """When the oldest transaction that has written and not yet ended began (other than
        ``conn``'s, which holds a row lock already); ``None`` when none is open. Where the
        database's view may be out of date, a time no open write can be older than. A
        single-writer database needs none: its writes commit before the next writer starts."""
        return None

    def begin_snapshot(self, conn: Connection) -> None:
        """Start a read-only transaction whose statements all see one snapshot, where the
        backend's default would give each statement its own."""

    def end_read(self, conn: Connection) -> None:
        """End a read's transaction before its connection goes back to the pool: nothing
        here, the pool's reset rolls it back (one round trip; a COMMIT first would add one
        where the driver sends its ROLLBACK anyway)."""

    def selective(self, condition: ColumnElement[bool]) -> ColumnElement[bool]:
        """``condition``, marked as true for few rows, where the planner takes such a hint: it
        then prefers the index that ``condition`` narrows over one that only orders rows."""
        return condition

    def lock_row(self, query: Select[Any]) -> Select[Any]:
        """Lock the selected row until the transaction ends (``FOR UPDATE`` where the backend
        has row locks: two operators requeueing the same job take turns; SQLite's write lock
        already serialises them)."""
        return query.with_for_update() if self.supports_row_locks else query

    def skip_locked(self, query: Select[Any]) -> Select[Any]:
        """Let concurrent readers of ``query`` skip rows another transaction holds (``FOR
        UPDATE SKIP LOCKED``: concurrent maintenance passes take disjoint rows), if possible."""
        return query.with_for_update(skip_locked=True) if self.supports_skip_locked else query

    @abc.abstractmethod
    def conflict_insert(self, table: Table) -> Any:
        """The backend's own INSERT construct, the one that knows ``ON CONFLICT``."""

    def insert_ignoring_duplicate_keys(self) -> Insert:
        """An INSERT into ``sqlqueue_jobs`` that skips rows whose idempotency key exists."""
        stmt: Insert = self.conflict_insert(jobs).on_conflict_do_nothing(
            index_elements=[jobs.c.idempotency_key]
        )
        return stmt

    def upsert(
        self,
        table: Table,
        *,
        values: Mapping[str, Any],
        conflict: Sequence[str],
        set_: Mapping[str, Any],
        where: ColumnElement[bool],
    ) -> Insert:
        """``INSERT … ON CONFLICT (conflict) DO UPDATE SET … WHERE …`` in one atomic statement
        (PostgreSQL: the conflicting row's lock; SQLite: the write lock).

        In ``set_`` and ``where``, ``table.c.column`` means the existing row. Where ``where``
        is false the row is left alone and ``RETURNING`` yields nothing for it.
        """
        stmt: Insert = (
            self.conflict_insert(table)
            .values(**values)
            .on_conflict_do_update(index_elements=list(conflict), set_=dict(set_), where=where)
        )
        return stmt

    # -- errors ------------------------------------------------------------------------------

    def translate_error(self, error: BaseException) -> SqlqueueError | None:
        """The sqlqueue error for a driver error, or ``None`` when it is not the database's."""
        if isinstance(error, sa_exc.DBAPIError):
            if self._is_missing_table(error):
                return SchemaNotMigrated(
                    f"sqlqueue's tables are missing ({str(error.orig).strip()}); "
                    f"run {self.migrate_command()} first"
                )
            advice = self._setup_advice(error)
            if advice is not None:
                return DatabaseError(advice)
            if error.connection_invalidated:
                return DatabaseUnavailable(self._unavailable_message(error))
            if self._is_refused(error):
                return DatabaseRefused(_first_line(error))
            if self._is_unavailable(error):
                return DatabaseUnavailable(self._unavailable_message(error))
            return DatabaseError(f"{type(error.orig).__name__}: {str(error.orig).strip()}")
        if isinstance(error, sa_exc.DisconnectionError | sa_exc.TimeoutError):
            return DatabaseUnavailable(f"the database connection failed: {error}")
        return None

    @abc.abstractmethod
    def _is_missing_table(self, error: sa_exc.DBAPIError) -> bool:
        """Whether the error says a table (or its schema) does not exist: not migrated."""

    def _setup_advice(self, error: sa_exc.DBAPIError) -> str | None:
        """A message naming the setting to change, for errors a misconfiguration causes."""
        return None

    def _is_unavailable(self, error: sa_exc.DBAPIError) -> bool:
        """Whether the error means "cannot reach the database now" (worth retrying later)."""
        return isinstance(error, sa_exc.OperationalError | sa_exc.InterfaceError)

    def _is_refused(self, error: sa_exc.DBAPIError) -> bool:
        """Whether the database refused the statement for its values: the one place that
        tells a write that can never succeed from one worth retrying (checked before
        :meth:`_is_unavailable`, whose driver classes mix the two)."""
        return isinstance(error, sa_exc.IntegrityError | sa_exc.DataError)

    @abc.abstractmethod
    def _unavailable_message(self, error: sa_exc.DBAPIError) -> str:
        """What to tell the user when the database cannot be reached, naming it."""

    # -- enqueue in bulk (see ``bulk_path``) and pooled connections (added for issue 4) ------

    def copy_driver(self, conn: Connection) -> bool:
        """Whether ``conn``'s driver can stream rows with :meth:`copy_rows` (``BulkPath.COPY``)."""
        raise NotImplementedError(f"{type(self).__name__} has BulkPath.COPY: define copy_driver()")

    def copy_rows(
        self,
        conn: Connection,
        table: Table,
        columns: Sequence[str],
        rows: Iterable[Sequence[Any]],
    ) -> None:
        """Stream ``rows`` (values in ``columns`` order) into ``table`` (in its own schema, or
        this dialect's when it names none) in the caller's transaction; driver errors come out
        as SQLAlchemy's (``BulkPath.COPY``)."""
        raise NotImplementedError(f"{type(self).__name__} has BulkPath.COPY: define copy_*()")

    def copy_allocation(self, staging_table: str) -> Select[Any]:
        """One row: the clock, an array of ``:count`` fresh job ids in ascending order, a
        wake-up sent (at commit) for each queue of ``:queues``, and whether the session's
        ``staging_table`` exists (``BulkPath.COPY``); its other parameters come from
        :meth:`copy_parameters`."""
        raise NotImplementedError(f"{type(self).__name__} has BulkPath.COPY: define copy_*()")

    def copy_parameters(self, conn: Connection) -> dict[str, Any]:
        """The parameters of :meth:`copy_allocation` that depend on this dialect's schema."""
        raise NotImplementedError(f"{type(self).__name__} has BulkPath.COPY: define copy_*()")

    def json_array_rows(self, document: ColumnElement[str]) -> Any:
        """A table of the elements of the JSON array ``document``, with columns ``key`` (the
        position) and ``value`` (``BulkPath.JSON_ARRAY``)."""
        raise NotImplementedError(f"{type(self).__name__} has BulkPath.JSON_ARRAY: define json_*()")

    def json_element(self, array: ColumnElement[Any], index: int, type_: Any) -> ColumnElement[Any]:
        """The ``index``-th element of the JSON array ``array`` as ``type_``
        (``BulkPath.JSON_ARRAY``)."""
        raise NotImplementedError(f"{type(self).__name__} has BulkPath.JSON_ARRAY: define json_*()")

    def connection_dropped(self, dbapi_connection: Any) -> bool:
        """Whether an idle pooled connection is known dead without a round trip (the server
        closed it); ``False`` when unsure."""
        return False


def _first_line(error: sa_exc.DBAPIError) -> str:
    """The driver error's class and first line: the lines after it (PostgreSQL's ``DETAIL:
    Failing row contains …``) quote the row's values, a payload's among them."""
    text = str(error.orig).strip().splitlines()
    return f"{type(error.orig).__name__}: {text[0] if text else ''}"
