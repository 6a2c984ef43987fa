"""MariaDB ≥ 10.6 and MySQL ≥ 8.0 through PyMySQL.

Both servers have ``SELECT … FOR UPDATE SKIP LOCKED`` but no ``UPDATE … RETURNING`` (MySQL has
no ``RETURNING`` at all), so every statement that returns rows runs through
:meth:`MySQLDialect.execute_returning`: it locks the target rows with a ``SELECT … FOR UPDATE``,
writes them by primary key, and reads the returned columns back, all in the caller's
transaction (see ``dialects/_mysql_returning.py``). A claim is the same three steps, its lock
query being the due-jobs query with ``SKIP LOCKED``.

Connections run at READ COMMITTED: under REPEATABLE READ, InnoDB's gap locks made concurrent
upserts of a missing row deadlock, and ``SKIP LOCKED`` claims are meant for READ COMMITTED.
Deadlocks (1213) and lock-wait timeouts (1205) roll the transaction back; the store's write
transactions are then run again (:meth:`MySQLDialect.retry_transaction`).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from sqlalchemy import (
    URL,
    Connection,
    Engine,
    Float,
    Insert,
    Integer,
    Result,
    Table,
    Text,
    Update,
    bindparam,
    event,
    exists,
    func,
    literal_column,
    or_,
    select,
    type_coerce,
    union_all,
)
from sqlalchemy import exc as sa_exc
from sqlalchemy.sql.elements import ColumnElement

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

from sqlqueue._errors import DatabaseUnavailable, UnsupportedDatabase
from sqlqueue._schema import jobs
from sqlqueue._types import UtcDateTime
from sqlqueue.dialects import _mysql_open_writes as open_writes
from sqlqueue.dialects._base import Dialect, is_borrowed
from sqlqueue.dialects._claiming import _CLAIM_LIMIT, CLAIM_JSON, status_literal
from sqlqueue.dialects._mysql_returning import (
    LOCK_OPTION,
    ConflictInsert,
    database_lock_name,
    run_returning,
)

__all__ = ["MIN_MARIADB_VERSION", "MIN_MYSQL_VERSION", "MySQLDialect", "check_server_version"]

T = TypeVar("T")

MIN_MARIADB_VERSION = (10, 6)
MIN_MYSQL_VERSION = (8, 0, 1)
#: ER_LOCK_DEADLOCK and ER_LOCK_WAIT_TIMEOUT: the transaction (or statement) was rolled back
#: and running it again is expected to succeed.
_RETRYABLE = frozenset({1205, 1213})
#: Server and client codes that mean "cannot reach the server now": too many connections,
#: shutting down, cannot connect, gone away, lost during a query, connection killed.
_UNREACHABLE = frozenset({1040, 1053, 1077, 1927, 2002, 2003, 2005, 2006, 2013, 2055, 4031})
_NO_SUCH_TABLE = 1146
#: Codes of statements refused for their values that PyMySQL raises as OperationalError or
#: InternalError: a wrong datetime or string value, a BIGINT or datetime out of range,
#: invalid JSON, a CHECK constraint, a value too large for the packet.
_REFUSED = frozenset({1292, 1366, 1367, 1441, 1690, 3140, 4025, 1153})
#: The statuses a claim takes jobs from (the claim index's predicate elsewhere).
_CLAIMABLE = ("queued", "failed")
#: Tries of a write transaction that deadlocked or timed out waiting for a lock.
_TRANSACTION_TRIES = 5
#: The named lock concurrent ``migrate`` runs of one database take turns on (its name includes
#: the database: see ``database_lock_name``), and how long one waits for it.
_MIGRATION_LOCK = "migrate"
_MIGRATION_LOCK_SECONDS = 120


def check_server_version(version: str) -> None:
    """Refuse servers without ``SKIP LOCKED`` (MariaDB < 10.6, MySQL < 8.0.1)."""
    release = version.removeprefix("5.5.5-")  # MariaDB's prefix for old MySQL clients
    numbers = tuple(int(part) for part in release.split("-")[0].split(".")[:3] if part.isdigit())
    mariadb = "mariadb" in version.lower()
    needed = MIN_MARIADB_VERSION if mariadb else MIN_MYSQL_VERSION
    if numbers < needed:
        name = "MariaDB" if mariadb else "MySQL"
        raise UnsupportedDatabase(
            f"{name} {release} has no SKIP LOCKED; sqlqueue needs MariaDB >= 10.6 or MySQL >= 8.0.1"
        )


def _datetime_literal(value: datetime, _mapping: Any = None) -> str:
    """A datetime parameter as a typed literal, ``TIMESTAMP'…'``: PyMySQL quotes it as text,
    which the server types as a string wherever no column gives it a type (a selected
    parameter, ``COALESCE(column, parameter)``), so it came back as a string and compared as
    one. Aware values are UTC here (``UtcDateTime`` converts them)."""
    return f"TIMESTAMP'{value:%Y-%m-%d %H:%M:%S.%f}'"


def _configure_connection(dbapi_connection: Any, _record: Any) -> None:
    """Check the server, then READ COMMITTED and UTC for the session, and datetimes sent as
    ``TIMESTAMP`` literals."""
    driver = getattr(dbapi_connection, "_connection", dbapi_connection)  # aiomysql's adapter
    encoders = getattr(driver, "encoders", None)
    if isinstance(encoders, dict):
        encoders[datetime] = _datetime_literal
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("SELECT VERSION()")
        check_server_version(str(cursor.fetchone()[0]))
        cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        cursor.execute("SET SESSION time_zone = '+00:00'")
    finally:
        cursor.close()


def _same_event_loop(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
    """aiomysql's connections belong to the event loop that opened them: one pooled from
    another loop (an earlier ``asyncio.run``, another worker) is discarded, and the pool
    opens a new one (``DisconnectionError`` on checkout makes it try again)."""
    driver = getattr(dbapi_connection, "_connection", None)
    loop = getattr(driver, "_loop", None)
    if loop is None:
        return
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        return
    if loop is not running:
        raise sa_exc.DisconnectionError("the connection belongs to another event loop")


def _error_code(error: BaseException) -> int | None:
    """The server's (or client's) numeric error code of a PyMySQL error."""
    orig = getattr(error, "orig", error)
    args = getattr(orig, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


class MySQLDialect(Dialect):
    """MariaDB ≥ 10.6 and MySQL ≥ 8.0.1 through PyMySQL."""

    names: ClassVar[tuple[str, ...]] = ("mysql", "mariadb")
    driver: ClassVar[str | None] = "pymysql"
    extra: ClassVar[str | None] = "mysql"
    supports_skip_locked: ClassVar[bool] = True
    deletes_by_limited_subquery: ClassVar[bool] = False
    supports_row_locks: ClassVar[bool] = True
    supports_listen_notify: ClassVar[bool] = False
    supports_many_hosts: ClassVar[bool] = True
    emulates_returning: ClassVar[bool] = True
    supports_partial_indexes: ClassVar[bool] = False
    #: Durability (``innodb_flush_log_at_trx_commit``) is the server's, not a transaction's.
    supports_relaxed_commit: ClassVar[bool] = False
    #: DDL commits implicitly: a failed migration keeps the statements before the failure.
    supports_transactional_ddl: ClassVar[bool] = False

    def url_problem(self, url: URL, *, lasting: bool = False) -> str | None:
        """A URL naming no database: the server lets the connection in, and SQLAlchemy then
        fails on sqlqueue's first table with a bare assertion."""
        if url.database:
            return None
        example = url.set(database="jobs").render_as_string(hide_password=True)
        return f"names no database: add one, as in {example} (CREATE DATABASE jobs first)"

    @contextmanager
    def migration_lock(self, conn: Connection) -> Iterator[None]:
        """A named lock (``GET_LOCK``) around the whole migration: MySQL commits each DDL
        statement at once, so no transaction keeps two first migrations apart. The lock is
        the session's: released after the block, failed or not (or with the session). Its
        name is this database's: migrations of other databases on the server go on meanwhile."""
        name = database_lock_name(_MIGRATION_LOCK)
        got = conn.execute(select(func.get_lock(name, _MIGRATION_LOCK_SECONDS))).scalar()
        if got != 1:
            raise DatabaseUnavailable(
                f"another `sqlqueue migrate` held the migration lock for over "
                f"{_MIGRATION_LOCK_SECONDS} s"
            )
        try:
            yield
        finally:
            with suppress(sa_exc.DBAPIError):  # the session is gone, and its lock with it
                conn.execute(select(func.release_lock(name)))

    def prepare_engine(self, engine: Engine) -> None:
        """Check the server and run every new connection at READ COMMITTED, in UTC."""
        if not event.contains(engine, "connect", _configure_connection):
            event.listen(engine, "connect", _configure_connection)
            if engine.dialect.is_async:
                event.listen(engine, "checkout", _same_event_loop)
            engine.dispose()  # idle pooled connections were opened without the settings

    def retry_transaction(self, operation: Callable[[], T]) -> T:
        """Run ``operation`` (a whole write transaction) again after a deadlock or a lock-wait
        timeout, a few times, after a short random pause: InnoDB picks a victim among the
        transactions of a lock cycle and rolls it back, expecting the application to retry."""
        for attempt in range(1, _TRANSACTION_TRIES + 1):
            try:
                return operation()
            except sa_exc.DBAPIError as error:
                if _error_code(error) not in _RETRYABLE or attempt == _TRANSACTION_TRIES:
                    raise
                time.sleep(random.uniform(0.0, 0.01 * attempt))
        raise AssertionError("unreachable")  # pragma: no cover

    # -- the database clock ------------------------------------------------------------------

    def clock(self) -> ColumnElement[datetime]:
        """``UTC_TIMESTAMP(6)``: microseconds, fixed for the whole statement."""
        return func.utc_timestamp(literal_column("6"), type_=UtcDateTime())

    def async_url(self, url: URL) -> URL:
        """PyMySQL's asyncio counterpart, aiomysql (built on it)."""
        return url.set(drivername=f"{url.get_backend_name()}+aiomysql")

    def clock_plus(self, seconds: ColumnElement[float]) -> ColumnElement[datetime]:
        """``TIMESTAMPADD(MICROSECOND, …)``: an ``INTERVAL n SECOND`` would drop the fraction
        of a float parameter on some servers."""
        micros = func.round(seconds * literal_column("1000000"))
        return func.timestampadd(
            literal_column("MICROSECOND"), micros, self.clock(), type_=UtcDateTime()
        )

    def seconds_between(
        self, later: ColumnElement[datetime], earlier: ColumnElement[datetime]
    ) -> ColumnElement[float]:
        """``TIMESTAMPDIFF`` in microseconds, divided down to seconds."""
        micros = func.timestampdiff(literal_column("MICROSECOND"), earlier, later)
        return type_coerce(micros / literal_column("1000000.0"), Float())

    # -- statements --------------------------------------------------------------------------

    def claim_statement(
        self,
        *,
        queues: Sequence[str],
        job_types: Sequence[str] | None,
        lease_seconds: float,
        now: datetime | None,
        floor: bool = False,
        limited: bool = False,
    ) -> Update:
        """The lease by id, carrying its lock query (the due jobs, ``FOR UPDATE SKIP LOCKED``)
        for :meth:`execute_returning` to run first: MySQL refuses ``LIMIT`` in an ``IN``
        subquery, and neither server has ``UPDATE … RETURNING``.

        The lock query takes each claimable status on its own, through
        ``ix_sqlqueue_jobs_claim_by_status`` in claim order up to the limit, and keeps the
        first ``:claim_limit`` of both: one ``status IN (…)`` range cannot come out of an index
        in claim order, and the full claim index walks every finished job of the queue. Rows of
        the longer list beyond the limit stay locked until the claim commits (other workers
        skip them for that long)."""
        parts = [
            self._due_jobs(
                queues=queues,
                job_types=job_types,
                limit=_CLAIM_LIMIT,
                now=now,
                floor=floor,
                limited=limited,
            )
            .add_columns(jobs.c.priority, jobs.c.next_run_at)
            .where(jobs.c.status == status_literal(status))
            .with_for_update(skip_locked=True)
            for status in _CLAIMABLE
        ]
        both = union_all(*parts)
        order = both.selected_columns
        due = both.order_by(order.priority, order.next_run_at, order.id).limit(_CLAIM_LIMIT)
        chosen: Any = bindparam("sqlqueue_ids", expanding=True)
        lease = self._lease(chosen, lease_seconds, now, in_subquery=True)
        return lease.execution_options(**{LOCK_OPTION: due})

    def due_jobs_exist(
        self, *, queues: Sequence[str], job_types: Sequence[str] | None, now: datetime | None
    ) -> ColumnElement[bool]:
        """Each claimable status on its own, as the claim reads them (see
        :meth:`claim_statement`): one ``status IN (…)`` would walk the finished jobs too."""
        return or_(
            *(
                exists(
                    self._due_jobs(
                        queues=queues,
                        job_types=job_types,
                        limit=literal_column("1", Integer()),
                        now=now,
                    )
                    .where(jobs.c.status == status_literal(status))
                    .order_by(None)
                    .limit(None)
                )
                for status in _CLAIMABLE
            )
        )

    def _claim_column(self, column: ColumnElement[Any]) -> ColumnElement[Any]:
        """JSON comes back as text without a cast (MySQL has no ``CAST(… AS TEXT)``)."""
        if column.name in CLAIM_JSON:
            return type_coerce(column, Text()).label(column.name)
        return super()._claim_column(column)

    def execute_returning(
        self,
        conn: Connection | Session,
        stmt: Any,
        params: Any = None,
        *,
        execution_options: Mapping[str, Any] | None = None,
    ) -> Result[*tuple[Any, ...]]:
        """Emulate ``RETURNING`` and ``ON CONFLICT`` (see ``dialects/_mysql_returning.py``).
        ``execution_options`` carry only a schema's table options, and this backend has no
        schemas (``supports_schemas`` is false), so there are none to pass on."""
        return run_returning(conn, stmt, params)

    def oldest_open_write(self, conn: Connection) -> datetime | None:
        """From ``information_schema.innodb_trx``, which InnoDB serves from a copy it may not
        have refreshed: see ``dialects/_mysql_open_writes.py`` for how a stale copy is told
        and what is answered then."""
        return open_writes.oldest_open_write(conn)

    def begin_snapshot(self, conn: Connection) -> None:
        """``REPEATABLE READ, READ ONLY`` for the next transaction: at the session's READ
        COMMITTED each statement would see its own snapshot. (Not on a borrowed connection:
        its owner's transaction is already under way.)"""
        if not is_borrowed(conn):
            conn.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")

    def conflict_insert(self, table: Table) -> Any:
        """An INSERT that knows ``on_conflict_do_nothing`` (see :class:`ConflictInsert`)."""
        return ConflictInsert(table)

    def upsert(
        self,
        table: Table,
        *,
        values: Mapping[str, Any],
        conflict: Sequence[str],
        set_: Mapping[str, Any],
        where: ColumnElement[bool],
    ) -> Insert:
        """The upsert as a :class:`ConflictInsert` that :meth:`execute_returning` runs as a
        locked read, then an INSERT or an UPDATE (``ON DUPLICATE KEY UPDATE`` assigns left to
        right and has no WHERE, so it cannot keep the base semantics)."""
        return (
            ConflictInsert(table)
            .values(**values)
            .on_conflict_do_update(index_elements=list(conflict), set_=dict(set_), where=where)
        )

    # -- errors ------------------------------------------------------------------------------

    def _is_missing_table(self, error: sa_exc.DBAPIError) -> bool:
        return _error_code(error) == _NO_SUCH_TABLE

    def _is_refused(self, error: sa_exc.DBAPIError) -> bool:
        """PyMySQL's DataError and IntegrityError, and the refusals it files under
        OperationalError (see ``_REFUSED``)."""
        return super()._is_refused(error) or _error_code(error) in _REFUSED

    def _is_unavailable(self, error: sa_exc.DBAPIError) -> bool:
        """Unreachable servers and lock conflicts that outlived the retries; PyMySQL raises
        OperationalError for plenty of statement errors too."""
        code = _error_code(error)
        if code is None:
            return isinstance(error, sa_exc.InterfaceError | sa_exc.OperationalError)
        return code in _UNREACHABLE or code in _RETRYABLE

    def _unavailable_message(self, error: sa_exc.DBAPIError) -> str:
        text = " ".join(str(error.orig).split())
        if _error_code(error) in _RETRYABLE:
            return f"the database kept refusing a transaction over locks: {text}"
        return f"cannot reach MariaDB/MySQL: {text}"
