"""Bulk enqueue by COPY (``BulkPath.COPY``, PostgreSQL): rows streamed instead of INSERTed.

Multi-row INSERTs cost the driver a parse of statements with thousands of placeholders and the
server a parse and plan per 1,000 rows; COPY streams rows in one go, at ~3x the rate. COPY
returns nothing, so ids are taken from the table's sequence first (one statement, which also
reads the database clock and sends one wake-up per queue: delivered at commit, as the INSERT
path's), and each row is written with its id. Rows with idempotency keys go through a temporary
staging table, from which one ``INSERT … SELECT … ON CONFLICT DO NOTHING`` moves them, so a
known key still writes nothing and returns the existing job's id.

It pays off from :data:`COPY_MIN_ROWS` rows: below that the extra statements (ids, COPY,
staging) cost more than the INSERT's per-row work saves. It needs a driver the dialect can COPY
through (psycopg 3's synchronous connection; otherwise ``None``: use INSERTs). Everything runs
on the caller's connection, in the caller's transaction. The columns come from
``sqlqueue._schema.ENQUEUE_COLUMNS``; the dialect builds the statements only it can say.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from operator import itemgetter
from typing import Any, Final

from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    MetaData,
    Table,
    bindparam,
    delete,
    literal,
    select,
)
from sqlalchemy.schema import CreateTable

from sqlqueue._schema import ENQUEUE_COLUMNS, ROW_COLUMNS, ColumnKind, Fill, JobColumn, jobs
from sqlqueue._store._direct import can_run_directly
from sqlqueue._types import EncodedJson, UtcDateTime
from sqlqueue.dialects import Dialect

__all__ = ["COPY_MIN_ROWS", "copy_jobs"]

#: Smallest batch written with COPY (measured on loopback: COPY wins from ~100 rows).
COPY_MIN_ROWS: Final = 200

#: The column of the unique key a known job is found by; rows without one skip the staging.
_KEY: Final = jobs.c.idempotency_key.name
#: The column an enqueue computes from the row's ``_run_at`` and ``_delay``.
_DUE: Final = next(column.name for column in ENQUEUE_COLUMNS if column.fill is Fill.DUE)
#: Columns written with the same value for every row of a call: constants and the clock.
_FIXED: Final = tuple(c for c in ENQUEUE_COLUMNS if c.fill in (Fill.CONSTANT, Fill.CLOCK))

#: A batch without keys, COPYed straight into ``sqlqueue_jobs``: each row is its id, its own
#: values, its due time, then the fixed values.
_DIRECT_ROW: Final = tuple(c.name for c in ROW_COLUMNS if c.name != _KEY)
_DIRECT_COLUMNS: Final = ("id", *_DIRECT_ROW, _DUE, *(c.name for c in _FIXED))
#: A batch with keys goes through the staging table: id, the row's values, its due time.
_STAGED_ROW: Final = tuple(c.name for c in ROW_COLUMNS)
_STAGED_COLUMNS: Final = ("id", *_STAGED_ROW, _DUE)

#: Where keyed rows wait for their ``INSERT … ON CONFLICT``: private to the session, emptied by
#: each use and at every commit. Named in ``pg_temp`` so that a schema translate map (sqlqueue's
#: tables in a named schema) leaves it where temporary tables live.
_staging = Table(
    "sqlqueue_enqueue_staging",
    MetaData(),
    Column("id", BigInteger, nullable=False),
    *(
        Column(name, jobs.c[name].type, nullable=jobs.c[name].nullable)
        for name in _STAGED_COLUMNS[1:]
    ),
    prefixes=["TEMPORARY"],
    postgresql_on_commit="DELETE ROWS",
    schema="pg_temp",
)
_CREATE_STAGING: Final = CreateTable(_staging, if_not_exists=True)


def _fixed_value(column: JobColumn, now: datetime) -> Any:
    """A fixed column's value as COPY writes it (JSON constants are already text)."""
    return now if column.fill is Fill.CLOCK else column.constant


def _fixed_expression(column: JobColumn, now: Any) -> Any:
    """A fixed column's value in the staging move's SELECT."""
    if column.fill is Fill.CLOCK:
        return now
    if column.kind in (ColumnKind.JSON, ColumnKind.JSON_LIST):
        return bindparam(f"sqlqueue_{column.name}", column.constant, type_=EncodedJson())
    return literal(column.constant)


_STATEMENTS: dict[type[Dialect], tuple[Any, Any]] = {}


def _statements(dialect: Dialect) -> tuple[Any, Any]:
    """The dialect's allocation statement and the staging move, built once per dialect."""
    found = _STATEMENTS.get(type(dialect))
    if found is None:
        found = _STATEMENTS[type(dialect)] = (
            dialect.copy_allocation(_staging.name),
            _move_staged(dialect),
        )
    return found


def _move_staged(dialect: Dialect) -> Any:
    """Empty the staging table into ``sqlqueue_jobs``, skipping known keys; RETURNING the ids
    written. Rows of an earlier, failed call in this transaction (ids below ``:first_id``) are
    dropped, never written."""
    staged = delete(_staging).returning(*_staging.columns).cte("sqlqueue_staged")
    now = bindparam("now", type_=UtcDateTime())
    values = [
        staged.c[column.name] if column.fill in (Fill.ROW, Fill.DUE) else
        _fixed_expression(column, now)
        for column in ENQUEUE_COLUMNS
    ]  # fmt: skip
    rows = (
        select(staged.c.id, *values)
        .where(staged.c.id >= bindparam("first_id", type_=BigInteger()))
        .order_by(staged.c.id)
    )
    target = [jobs.c.id, *(jobs.c[column.name] for column in ENQUEUE_COLUMNS)]
    return dialect.insert_ignoring_duplicate_keys().from_select(target, rows).returning(jobs.c.id)


def copy_jobs(
    dialect: Dialect, conn: Connection, rows: Sequence[Mapping[str, Any]]
) -> list[int | None] | None:
    """Write ``rows`` (checked, distinct keys) with COPY; one id per row, ``None`` where the
    row's key exists. ``None`` overall when COPY does not pay or the driver cannot COPY."""
    if len(rows) < COPY_MIN_ROWS or not _can_copy(dialect, conn):
        return None
    allocate, move_staged = _statements(dialect)
    queues = sorted({row["queue"] for row in rows})
    now, fresh, _, staging_exists = conn.execute(
        allocate, {"count": len(rows), "queues": queues, **dialect.copy_parameters(conn)}
    ).one()
    ids: list[int] = sorted(fresh)
    if all(row[_KEY] is None for row in rows):
        dialect.copy_rows(conn, jobs, _DIRECT_COLUMNS, _direct_rows(rows, ids, now))
        return list(ids)
    if not staging_exists:
        conn.execute(_CREATE_STAGING)
    dialect.copy_rows(conn, _staging, _STAGED_COLUMNS, _staged_rows(rows, ids, now))
    moved = conn.execute(
        move_staged, {"now": now, "first_id": ids[0]}, execution_options=dialect.table_options
    )
    written = set(moved.scalars().all())
    return [job_id if job_id in written else None for job_id in ids]


def _can_copy(dialect: Dialect, conn: Connection) -> bool:
    """A driver the dialect can COPY through, and nothing listening for the statements COPY
    bypasses."""
    return dialect.copy_driver(conn) and can_run_directly(conn)


def _due(row: Mapping[str, Any], now: datetime) -> datetime:
    run_at: datetime | None = row["_run_at"]
    if run_at is not None:
        return run_at
    delay: float = row["_delay"]
    return now + timedelta(seconds=delay) if delay else now


#: The row's own values, in column order, as one tuple (``itemgetter`` of several names).
_pick_direct: Final = itemgetter(*_DIRECT_ROW)
_pick_staged: Final = itemgetter(*_STAGED_ROW)


def _direct_rows(
    rows: Sequence[Mapping[str, Any]], ids: list[int], now: datetime
) -> Iterable[tuple[Any, ...]]:
    fixed = tuple(_fixed_value(column, now) for column in _FIXED)
    pick = _pick_direct
    for job_id, row in zip(ids, rows, strict=True):
        yield (job_id, *pick(row), _due(row, now), *fixed)


def _staged_rows(
    rows: Sequence[Mapping[str, Any]], ids: list[int], now: datetime
) -> Iterable[tuple[Any, ...]]:
    pick = _pick_staged
    for job_id, row in zip(ids, rows, strict=True):
        yield (job_id, *pick(row), _due(row, now))
