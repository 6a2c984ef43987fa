"""PostgreSQL: the production backend.

Claims lock due rows with ``FOR UPDATE SKIP LOCKED`` in a materialized CTE (so the row
selection runs exactly once) and lease them with ``UPDATE … FROM … RETURNING``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar

from sqlalchemy import (
    URL,
    BigInteger,
    Connection,
    Engine,
    Float,
    Integer,
    Interval,
    Select,
    String,
    Table,
    Text,
    Update,
    bindparam,
    cast,
    event,
    extract,
    func,
    literal_column,
    select,
    type_coerce,
)
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects.postgresql import ARRAY, REGCLASS
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.schema import CreateSchema
from sqlalchemy.sql.elements import ColumnElement

from sqlqueue._errors import ConfigurationError
from sqlqueue._schema import jobs
from sqlqueue._types import UtcDateTime, as_utc
from sqlqueue.dialects._base import BulkPath, Dialect, is_borrowed
from sqlqueue.dialects._claiming import _CLAIM_LIMIT, CLAIM_TIMESTAMPS, status_literal
from sqlqueue.dialects._history import HistoryPartitions

if TYPE_CHECKING:
    from psycopg import sql

__all__ = ["PostgresDialect"]

#: SQLSTATE classes of statements refused for their values (see ``_is_refused``).
_REFUSED_CLASSES = frozenset({"22", "23", "54"})
_UNDEFINED_TABLE = "42P01"
_UNDEFINED_SCHEMA = "3F000"
_ID_ARRAY = ARRAY(BigInteger())
_ATTEMPT_ARRAY = ARRAY(Integer())
#: invalid_sql_statement_name, duplicate_prepared_statement.
_PREPARED_STATEMENT_CLASH = frozenset({"26000", "42P05"})
#: Arbitrary but fixed: the advisory lock key sqlqueue's migrations serialise on.
_MIGRATION_LOCK_KEY = 0x5371_7565_7565


class PostgresDialect(HistoryPartitions, Dialect):
    """PostgreSQL ≥ 12 through psycopg 3."""

    names: ClassVar[tuple[str, ...]] = ("postgresql",)
    #: ``postgres://``, as hosting providers hand URLs out (SQLAlchemy dropped it in 1.4).
    url_aliases: ClassVar[tuple[str, ...]] = ("postgres",)
    driver: ClassVar[str | None] = "psycopg"
    extra: ClassVar[str | None] = "postgres"
    supports_skip_locked: ClassVar[bool] = True
    supports_row_locks: ClassVar[bool] = True
    supports_transaction_settings: ClassVar[bool] = True
    supports_listen_notify: ClassVar[bool] = True
    supports_many_hosts: ClassVar[bool] = True
    supports_schemas: ClassVar[bool] = True
    bulk_path: ClassVar[BulkPath] = BulkPath.COPY
    supports_claim_floor: ClassVar[bool] = True
    supports_history_partitions: ClassVar[bool] = True
    supports_modifying_ctes: ClassVar[bool] = True

    def clock(self) -> ColumnElement[datetime]:
        """``statement_timestamp()``: stable within a statement, so it can use indexes."""
        return func.statement_timestamp(type_=UtcDateTime())

    def clock_plus(self, seconds: ColumnElement[float]) -> ColumnElement[datetime]:
        """The statement time plus ``seconds`` as an interval."""
        zero: ColumnElement[int] = literal_column("0", Integer())
        interval = func.make_interval(zero, zero, zero, zero, zero, zero, seconds, type_=Interval())
        return type_coerce(func.statement_timestamp() + interval, UtcDateTime())

    def seconds_between(
        self, later: ColumnElement[datetime], earlier: ColumnElement[datetime]
    ) -> ColumnElement[float]:
        """``EXTRACT(EPOCH FROM later - earlier)`` as double precision (it is numeric on 14+)."""
        return cast(extract("epoch", later - earlier), Float())

    def _claim_column(self, column: ColumnElement[Any]) -> ColumnElement[Any]:
        """Timestamps come back as text (``timestamptz::text``), read once per distinct value
        by :meth:`claim_moment`: psycopg made a zone-aware datetime of each value, 0.4 µs of the
        worker's CPU apiece, four per claimed job (the same values a claim shares)."""
        if column.name in CLAIM_TIMESTAMPS:
            return cast(column, Text()).label(column.name)
        return super()._claim_column(column)

    def claim_moment(self, value: Any) -> datetime:
        """A claimed timestamp as PostgreSQL writes it in its ISO ``DateStyle`` (with the
        session's UTC offset), as an aware UTC datetime. psycopg reads timestamps in no
        other ``DateStyle`` either, so this asks nothing new of the connection."""
        if isinstance(value, datetime):
            return as_utc(value)
        try:
            return as_utc(datetime.fromisoformat(value))
        except ValueError:
            raise ConfigurationError(
                f"PostgreSQL sent the timestamp {value!r}, not in its ISO DateStyle: sqlqueue "
                "(and psycopg) read timestamps only in that one; set DateStyle = 'ISO' for "
                "sqlqueue's connections (the server's default)"
            ) from None

    def async_url(self, url: URL) -> URL:
        """psycopg 3 speaks asyncio under the same driver name."""
        return url.set(drivername="postgresql+psycopg")

    @contextmanager
    def listen(self, engine: Engine, channel: str) -> Iterator[Callable[[float], Iterator[str]]]:
        """LISTEN on a connection of its own (taken out of the pool, closed afterwards)."""
        from psycopg import sql  # the driver is an optional extra: import it only when used

        raw = engine.raw_connection()
        try:
            driver = raw.driver_connection
            assert driver is not None
            driver.autocommit = True
            driver.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))

            def wait(timeout: float) -> Iterator[str]:
                return (notice.payload for notice in driver.notifies(timeout=timeout))

            yield wait
        finally:
            raw.invalidate()

    def wake_columns(self) -> tuple[ColumnElement[Any], ...]:
        """``pg_notify(channel, queue)`` in the INSERT's RETURNING (the channel of this
        dialect's schema, see ``wake_channel``): delivered at commit, deduplicated per
        transaction by the server, and no extra round trip."""
        return (func.pg_notify(self.wake_channel, jobs.c.queue).label("sqlqueue_wake"),)

    def notify_statement(self, payload: str) -> Select[Any] | None:
        """``SELECT pg_notify(channel, payload)``: delivered when the transaction commits."""
        payload_value = bindparam(None, payload, type_=String())
        return select(func.pg_notify(self.wake_channel, payload_value))

    def oldest_open_write(self, conn: Connection) -> datetime | None:
        """The start of the oldest other transaction in this database that holds a
        transaction id (it has written), from ``pg_stat_activity``. Other databases are left
        out: their writes cannot land in our tables, and a busy neighbour held the counts back.
        (Sessions of other roles show no times there without ``pg_read_all_stats``: sqlqueue's
        own sessions share a role in practice.)"""
        started: datetime | None = conn.exec_driver_sql(
            "SELECT min(xact_start) FROM pg_stat_activity "
            "WHERE backend_xid IS NOT NULL AND pid <> pg_backend_pid() "
            "AND datname = current_database()"
        ).scalar()
        return started

    def borrow(self, engine: Engine) -> None:
        """As every dialect does, and: Django's psycopg connections read ``jsonb`` as text
        (its JSONField decodes it), so sqlqueue's statements get psycopg's JSON loaders back,
        on their own cursors."""
        super().borrow(engine)
        if not event.contains(engine, "before_cursor_execute", _json_decoded):
            event.listen(engine, "before_cursor_execute", _json_decoded)

    def begin_snapshot(self, conn: Connection) -> None:
        """``REPEATABLE READ, READ ONLY``: under the default READ COMMITTED each statement has
        its own snapshot, and a job finishing between two counts was counted twice. (Not on
        a borrowed connection: its owner's transaction is already under way.)"""
        if not is_borrowed(conn):
            conn.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")

    def end_read(self, conn: Connection) -> None:
        """COMMIT: psycopg forgets every prepared statement of the connection at each ROLLBACK
        it sends, and sends none when the pool resets a connection left idle (see
        ``sqlqueue/_store/transactions.py``)."""
        conn.commit()

    def relax_commit(self, conn: Connection) -> None:
        """``SET LOCAL synchronous_commit = off``: this transaction only, never the session."""
        conn.exec_driver_sql("SET LOCAL synchronous_commit = off")

    @contextmanager
    def migration_lock(self, conn: Connection) -> Iterator[None]:
        """A transaction-scoped advisory lock: concurrent first migrations queue up (it is
        held until the transaction ends, past the block)."""
        conn.execute(select(func.pg_advisory_xact_lock(_MIGRATION_LOCK_KEY)))
        yield

    @contextmanager
    def migrating_in_schema(self, conn: Connection) -> Iterator[None]:
        """Create the schema if it is missing, and put it alone on this transaction's
        ``search_path`` for the block (then restore the path). A schema translate map would
        not do: alembic writes some statements' table names itself (``ALTER TABLE`` of
        ``add_column``), unqualified, so they would change the tables of the default schema.
        If the block fails, the caller rolls back, which undoes the path with the rest."""
        if self.schema is None:
            yield
            return
        conn.execute(CreateSchema(self.schema, if_not_exists=True))
        path = func.set_config("search_path", bindparam("path", type_=String()), True)
        before = conn.execute(select(func.current_setting("search_path"))).scalar_one()
        conn.execute(select(path), {"path": self._quoted_schema(conn)})
        yield
        conn.execute(select(path), {"path": before})

    def _quoted_schema(self, conn: Connection) -> str:
        quoted: str = conn.dialect.identifier_preparer.quote_identifier(self.schema or "")
        return quoted

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
        """Lock up to ``:claim_limit`` due rows, skipping rows other workers hold, and lease
        them (parameters as in :meth:`Dialect.claim_statement`)."""
        due = (
            self._due_jobs(
                queues=queues,
                job_types=job_types,
                limit=_CLAIM_LIMIT,
                now=now,
                floor=floor,
                limited=limited,
            )
            .with_for_update(skip_locked=True)
            .cte("sqlqueue_due")
            .prefix_with("MATERIALIZED")
        )
        return self._lease(due.c.id, lease_seconds, now, in_subquery=False)

    def holds_lease(
        self, worker_id: Any, fences: Sequence[tuple[int, int]] | None = None
    ) -> list[ColumnElement[bool]]:
        """The fence checked on rows found by primary key and locked first (in id order, so
        concurrent transitions cannot deadlock). Checked on the table itself, the ``status``
        test matched the partial lease index, whose dead entries (one per claim and heartbeat
        until vacuum) made a ten-row completion scan thousands of index entries (~2 ms).

        The fences travel as two arrays, so the statement's text is the same for any number
        of them (psycopg parses a long statement anew each time: 1.2 ms for 100 fences). They
        are joined to the rows by id, each row carrying its fence's attempt: an ``(id,
        attempts) IN (unnest …)`` test planned as a nested loop over every pair (100 fences:
        0.6 ms of a 2 ms completion)."""
        if fences is None:
            ids: Any = bindparam("fence_ids", type_=_ID_ARRAY)
            attempts: Any = bindparam("fence_attempts", type_=_ATTEMPT_ARRAY)
        else:
            ids = bindparam(None, [job_id for job_id, _ in fences], type_=_ID_ARRAY)
            attempts = bindparam(None, [attempt for _, attempt in fences], type_=_ATTEMPT_ARRAY)
        pairs = (
            func.unnest(ids, attempts)
            .table_valued("id", "attempt")
            .render_derived(name="sqlqueue_fence")
        )
        locked = (
            select(jobs.c.id, jobs.c.status, jobs.c.locked_by, jobs.c.attempts, pairs.c.attempt)
            .join_from(jobs, pairs, jobs.c.id == pairs.c.id)
            .order_by(jobs.c.id)
            .with_for_update(of=jobs)
            .cte("sqlqueue_fenced")
            .prefix_with("MATERIALIZED")
        )
        return [
            jobs.c.id == locked.c.id,
            locked.c.status == status_literal("running"),
            locked.c.locked_by == worker_id,
            locked.c.attempts == locked.c.attempt,
        ]

    def fence_parameters(self, fences: Sequence[tuple[int, int]]) -> dict[str, Any]:
        """The two arrays of ``holds_lease(…, fences=None)``."""
        return {
            "fence_ids": [job_id for job_id, _ in fences],
            "fence_attempts": [attempt for _, attempt in fences],
        }

    def conflict_insert(self, table: Table) -> Any:
        """This backend's INSERT construct (``ON CONFLICT`` support)."""
        return pg_insert(table)

    def _is_missing_table(self, error: sa_exc.DBAPIError) -> bool:
        return getattr(error.orig, "sqlstate", None) in (_UNDEFINED_TABLE, _UNDEFINED_SCHEMA)

    def _is_refused(self, error: sa_exc.DBAPIError) -> bool:
        """SQLSTATE classes 22 (data exception: out of range, NUL in text), 23 (integrity
        constraint) and 54 (program limit exceeded: a value too large; psycopg files it under
        OperationalError, with the outages), and psycopg's own refusals before sending."""
        sqlstate = getattr(error.orig, "sqlstate", None)
        if sqlstate is None:
            return super()._is_refused(error)
        return str(sqlstate)[:2] in _REFUSED_CLASSES

    def _setup_advice(self, error: sa_exc.DBAPIError) -> str | None:
        """psycopg's server-side prepared statements missing or doubled: the connection goes
        through a pooler in transaction mode (PgBouncer < 1.21, or without
        max_prepared_statements), which hands each transaction another server session."""
        if getattr(error.orig, "sqlstate", None) not in _PREPARED_STATEMENT_CLASH:
            return None
        text = " ".join(str(error.orig).split())
        return (
            f"{text}: the connection goes through a pooler in transaction mode (PgBouncer?); "
            'build the engine with connect_args={"prepare_threshold": None}, or enable '
            "max_prepared_statements (PgBouncer >= 1.21)"
        )

    def _unavailable_message(self, error: sa_exc.DBAPIError) -> str:
        text = " ".join(str(error.orig).split())
        return f"cannot reach PostgreSQL: {text}"

    # -- enqueue in bulk (COPY) and pooled connections (added for issue 4) -------------------

    def copy_driver(self, conn: Connection) -> bool:
        """psycopg 3's synchronous connection (an async one, or another driver, cannot COPY)."""
        try:
            import psycopg
        except ImportError:  # pragma: no cover - another PostgreSQL driver
            return False
        return isinstance(conn.connection.driver_connection, psycopg.Connection)

    def copy_rows(
        self,
        conn: Connection,
        table: Table,
        columns: Sequence[str],
        rows: Iterable[Sequence[Any]],
    ) -> None:
        """``COPY table (columns) FROM STDIN`` on the caller's connection, into the table's
        schema, or this dialect's for sqlqueue's own tables (``table.schema`` unset); driver
        errors come out as SQLAlchemy's, like every other statement's, to be translated as
        theirs are."""
        import psycopg

        schema = table.schema if table.schema is not None else self.schema
        statement = _copy_statement(schema, table.name, tuple(columns))
        driver = conn.connection.driver_connection
        assert isinstance(driver, psycopg.Connection)
        try:
            with driver.cursor() as cursor, cursor.copy(statement) as copy:
                for row in rows:
                    copy.write_row(row)
        except psycopg.Error as error:
            raise sa_exc.DBAPIError.instance(
                statement.as_string(driver), None, error, psycopg.Error, dialect=conn.dialect
            ) from error

    def copy_allocation(self, staging_table: str) -> Select[Any]:
        """``statement_timestamp()``, ``nextval`` of the jobs' sequence ``:count`` times, one
        ``pg_notify`` on ``:channel`` per queue (delivered at commit, as the INSERT path's) and
        ``to_regclass('pg_temp.…')``: one round trip. The job table's name is bound as
        ``:jobs_table`` (with its schema, quoted: see :meth:`copy_parameters`)."""
        table_name = bindparam("jobs_table", type_=Text())
        sequence = select(
            cast(func.pg_get_serial_sequence(table_name, jobs.c.id.name), REGCLASS)
        ).scalar_subquery()
        ids = (
            select(func.array_agg(func.nextval(sequence), type_=_ID_ARRAY))
            .select_from(func.generate_series(1, bindparam("count", type_=Integer())))
            .scalar_subquery()
        )
        queues = (
            func.unnest(bindparam("queues", type_=ARRAY(Text())))
            .table_valued("queue")
            .render_derived()
        )
        channel = bindparam("channel", type_=Text())
        wakes = select(func.count(func.pg_notify(channel, queues.c.queue))).scalar_subquery()
        staging = func.to_regclass(f"pg_temp.{staging_table}").is_not(None)
        return select(self.clock(), ids, wakes, staging)

    def copy_parameters(self, conn: Connection) -> dict[str, Any]:
        """The ``:jobs_table`` and ``:channel`` of :meth:`copy_allocation` for this dialect's
        schema: the table's name as ``pg_get_serial_sequence`` reads it, and the wake channel."""
        name = jobs.name
        if self.schema is not None:
            quote = conn.dialect.identifier_preparer.quote_identifier
            name = f"{quote(self.schema)}.{quote(jobs.name)}"
        return {"jobs_table": name, "channel": self.wake_channel}

    def connection_dropped(self, dbapi_connection: Any) -> bool:
        """The server closed this idle psycopg 3 connection (terminated backend, restart): its
        socket has something to read — the server's farewell, then end-of-file — and reading
        that fails. A local poll, no round trip; an idle healthy connection has nothing to
        read (or a notice, which reading consumes)."""
        import select as select_module

        from psycopg.pq import ConnStatus

        pgconn = getattr(dbapi_connection, "pgconn", None)
        if pgconn is None:
            return False
        if pgconn.status != ConnStatus.OK:
            return True

        def readable() -> bool:
            try:
                if hasattr(select_module, "poll"):  # no FD_SETSIZE limit, unlike select()
                    poller = select_module.poll()
                    poller.register(pgconn.socket, select_module.POLLIN)
                    return bool(poller.poll(0))
                return bool(select_module.select([pgconn.socket], [], [], 0)[0])
            except (OSError, ValueError):  # cannot tell
                return False

        for _ in range(3):  # the farewell message and the end-of-file arrive separately
            if not readable():
                break
            try:
                pgconn.consume_input()
            except Exception:  # the read failed: the server is gone
                return True
        return bool(pgconn.status != ConnStatus.OK)


_COPY_STATEMENTS: dict[tuple[str | None, str, tuple[str, ...]], sql.Composed] = {}


def _copy_statement(schema: str | None, table: str, columns: tuple[str, ...]) -> sql.Composed:
    """``COPY [schema.]table (columns) FROM STDIN``, identifiers quoted by the driver; built
    once."""
    found = _COPY_STATEMENTS.get((schema, table, columns))
    if found is None:
        from psycopg import sql

        name = sql.Identifier(table) if schema is None else sql.Identifier(schema, table)
        found = sql.SQL("COPY {} ({}) FROM STDIN").format(
            name, sql.SQL(", ").join(map(sql.Identifier, columns))
        )
        _COPY_STATEMENTS[(schema, table, columns)] = found
    return found


def _json_decoded(
    conn: Connection, cursor: Any, statement: str, parameters: Any, context: Any, many: bool
) -> None:
    """psycopg 3's JSON loaders on ``cursor`` (whose adapters are its own copy of the
    connection's): ``jsonb`` and ``json`` columns come back decoded, whatever the connection's
    owner registered."""
    adapters = getattr(cursor, "adapters", None)
    if adapters is None:  # not psycopg 3: nothing was changed
        return
    from psycopg.types.json import JsonbLoader, JsonLoader

    adapters.register_loader("jsonb", JsonbLoader)
    adapters.register_loader("json", JsonLoader)
