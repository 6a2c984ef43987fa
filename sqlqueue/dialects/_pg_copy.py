"""PostgreSQL bulk enqueue: ``COPY … FROM STDIN`` instead of multi-row INSERTs.

Multi-row INSERTs cost the driver a parse of statements with thousands of placeholders and the
server a parse and plan per 1,000 rows; COPY streams rows in one go, at ~3x the rate. COPY
returns nothing, so ids are taken from the table's sequence first (one statement, which also
reads the database clock and sends one ``pg_notify`` per queue: delivered at commit, as the
INSERT path's), and each row is written with its id. Rows with idempotency keys go through a
temporary staging table, from which one ``INSERT … SELECT … ON CONFLICT DO NOTHING`` moves them,
so a known key still writes nothing and returns the existing job's id.

It pays off from :data:`COPY_MIN_ROWS` rows: below that the extra statements (ids, COPY,
staging) cost more than the INSERT's per-row work saves. It needs psycopg 3's synchronous
connection (an async one, or another driver, gets ``None``: use INSERTs). Everything runs on the
caller's connection, in the caller's transaction.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    bindparam,
    cast,
    delete,
    func,
    literal,
    select,
)
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, REGCLASS
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.schema import CreateTable

from sqlqueue._schema import jobs, table_options
from sqlqueue._store._direct import can_run_directly
from sqlqueue._types import EncodedJson, UtcDateTime
from sqlqueue.dialects._base import WAKE_CHANNEL

if TYPE_CHECKING:
    from psycopg import sql

__all__ = ["COPY_MIN_ROWS", "copy_jobs"]

#: Smallest batch written with COPY (measured on loopback: COPY wins from ~100 rows).
COPY_MIN_ROWS: Final = 200

#: Where keyed rows wait for their ``INSERT … ON CONFLICT``: private to the session, emptied by
#: each use and at every commit. Named in ``pg_temp`` so that a schema translate map (sqlqueue's
#: tables in a named schema) leaves it where temporary tables live.
_staging = Table(
    "sqlqueue_enqueue_staging",
    MetaData(),
    Column("id", BigInteger, nullable=False),
    Column("job_type", String(200), nullable=False),
    Column("queue", String(100), nullable=False),
    Column("priority", Integer, nullable=False),
    Column("payload", JSONB, nullable=False),
    Column("max_attempts", Integer, nullable=False),
    Column("next_run_at", UtcDateTime, nullable=False),
    Column("idempotency_key", String(255), nullable=True),
    Column("group_key", String(255), nullable=True),
    prefixes=["TEMPORARY"],
    postgresql_on_commit="DELETE ROWS",
    schema="pg_temp",
)

_STAGING_COLUMNS: Final = tuple(column.name for column in _staging.columns)
_DIRECT_COLUMNS: Final = (
    "id",
    "job_type",
    "queue",
    "priority",
    "payload",
    "status",
    "attempts",
    "max_attempts",
    "errors",
    "next_run_at",
    "created_at",
    "updated_at",
    "group_key",
)


def _allocate() -> Any:
    """``now``, ``:count`` fresh ids of the sequence of table ``:jobs_table``, one wake on
    ``:channel`` per queue of ``:queues``, and whether the staging table exists in this
    session — one round trip."""
    table_name = bindparam("jobs_table", type_=Text())
    sequence = select(
        cast(func.pg_get_serial_sequence(table_name, jobs.c.id.name), REGCLASS)
    ).scalar_subquery()
    ids = (
        select(func.array_agg(func.nextval(sequence), type_=ARRAY(BigInteger())))
        .select_from(func.generate_series(1, bindparam("count", type_=Integer())))
        .scalar_subquery()
    )
    queues = (
        func.unnest(bindparam("queues", type_=ARRAY(Text()))).table_valued("queue").render_derived()
    )
    channel = bindparam("channel", type_=Text())
    wakes = select(func.count(func.pg_notify(channel, queues.c.queue))).scalar_subquery()
    staging = func.to_regclass(f"pg_temp.{_staging.name}").is_not(None)
    return select(func.statement_timestamp(type_=UtcDateTime()), ids, wakes, staging)


def _move_staged() -> Any:
    """Empty the staging table into ``sqlqueue_jobs``, skipping known keys; RETURNING the ids
    written. Rows of an earlier, failed call in this transaction (ids below ``:first_id``) are
    dropped, never written."""
    staged = delete(_staging).returning(*_staging.columns).cte("sqlqueue_staged")
    now = bindparam("now", type_=UtcDateTime())
    rows = (
        select(
            staged.c.id,
            staged.c.job_type,
            staged.c.queue,
            staged.c.priority,
            staged.c.payload,
            literal("queued"),
            literal(0),
            staged.c.max_attempts,
            bindparam("no_errors", "[]", type_=EncodedJson()),
            staged.c.next_run_at,
            now,
            now,
            staged.c.idempotency_key,
            staged.c.group_key,
        )
        .where(staged.c.id >= bindparam("first_id", type_=BigInteger()))
        .order_by(staged.c.id)
    )
    target = [jobs.c[name] for name in (*_DIRECT_COLUMNS[:-1], "idempotency_key", "group_key")]
    return (
        pg_insert(jobs)
        .from_select(target, rows)
        .on_conflict_do_nothing(index_elements=[jobs.c.idempotency_key])
        .returning(jobs.c.id)
    )


_ALLOCATE: Final = _allocate()
_MOVE_STAGED: Final = _move_staged()
_CREATE_STAGING: Final = CreateTable(_staging, if_not_exists=True)


def copy_jobs(
    conn: Connection,
    rows: Sequence[Mapping[str, Any]],
    *,
    schema: str | None = None,
    channel: str = WAKE_CHANNEL,
) -> list[int | None] | None:
    """Write ``rows`` (checked, distinct keys) with COPY; one id per row, ``None`` where the
    row's key exists. ``None`` overall when COPY does not pay or the driver cannot COPY.
    ``schema``: the job table's (``None``: the connection's default); ``channel``: its workers'
    wake-up channel."""
    if len(rows) < COPY_MIN_ROWS or not _can_copy(conn):
        return None
    queues = sorted({row["queue"] for row in rows})
    jobs_table = _table_name(conn, schema)
    now, fresh, _, staging_exists = conn.execute(
        _ALLOCATE,
        {"count": len(rows), "queues": queues, "channel": channel, "jobs_table": jobs_table},
    ).one()
    ids: list[int] = sorted(fresh)
    if all(row["idempotency_key"] is None for row in rows):
        copy_direct = _copy_statement(schema, jobs.name, _DIRECT_COLUMNS)
        _copy(conn, copy_direct, _direct_rows(rows, ids, now))
        return list(ids)
    if not staging_exists:
        conn.execute(_CREATE_STAGING)
    copy_staged = _copy_statement(None, _staging.name, _STAGING_COLUMNS)
    _copy(conn, copy_staged, _staged_rows(rows, ids, now))
    written = set(
        conn.execute(
            _MOVE_STAGED,
            {"now": now, "first_id": ids[0]},
            execution_options=table_options(schema),
        )
        .scalars()
        .all()
    )
    return [job_id if job_id in written else None for job_id in ids]


def _can_copy(conn: Connection) -> bool:
    """psycopg 3's sync connection, and nothing listening for the statements COPY bypasses."""
    try:
        import psycopg
    except ImportError:  # pragma: no cover - another PostgreSQL driver
        return False
    return isinstance(conn.connection.driver_connection, psycopg.Connection) and (
        can_run_directly(conn)
    )


def _due(row: Mapping[str, Any], now: datetime) -> datetime:
    run_at: datetime | None = row["_run_at"]
    if run_at is not None:
        return run_at
    delay: float = row["_delay"]
    return now + timedelta(seconds=delay) if delay else now


def _direct_rows(
    rows: Sequence[Mapping[str, Any]], ids: list[int], now: datetime
) -> Iterable[tuple[Any, ...]]:
    for job_id, row in zip(ids, rows, strict=True):
        yield (
            job_id,
            row["job_type"],
            row["queue"],
            row["priority"],
            row["payload"],
            "queued",
            0,
            row["max_attempts"],
            "[]",
            _due(row, now),
            now,
            now,
            row["group_key"],
        )


def _staged_rows(
    rows: Sequence[Mapping[str, Any]], ids: list[int], now: datetime
) -> Iterable[tuple[Any, ...]]:
    for job_id, row in zip(ids, rows, strict=True):
        yield (
            job_id,
            row["job_type"],
            row["queue"],
            row["priority"],
            row["payload"],
            row["max_attempts"],
            _due(row, now),
            row["idempotency_key"],
            row["group_key"],
        )


def _table_name(conn: Connection, schema: str | None) -> str:
    """The job table's name as ``pg_get_serial_sequence`` reads it: with its schema, quoted."""
    if schema is None:
        return jobs.name
    quote = conn.dialect.identifier_preparer.quote_identifier
    return f"{quote(schema)}.{quote(jobs.name)}"


_COPY_STATEMENTS: dict[tuple[str | None, str, tuple[str, ...]], sql.Composed] = {}


def _copy_statement(schema: str | None, table: str, columns: tuple[str, ...]) -> sql.Composed:
    """``COPY schema.table (columns) FROM STDIN``, identifiers quoted by the driver."""
    found = _COPY_STATEMENTS.get((schema, table, columns))
    if found is None:
        from psycopg import sql

        name = sql.Identifier(table) if schema is None else sql.Identifier(schema, table)
        found = sql.SQL("COPY {} ({}) FROM STDIN").format(
            name, sql.SQL(", ").join(map(sql.Identifier, columns))
        )
        _COPY_STATEMENTS[(schema, table, columns)] = found
    return found


def _copy(conn: Connection, statement: sql.Composed, rows: Iterable[tuple[Any, ...]]) -> None:
    """Stream ``rows`` through COPY on the caller's connection; driver errors come out as
    SQLAlchemy's, like every other statement's, for the dialect to translate."""
    import psycopg

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
