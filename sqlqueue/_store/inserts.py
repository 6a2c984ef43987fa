"""INSERTs of job rows, plain and idempotent, one or thousands per round trip.

Idempotency is the database's job: a unique index on ``idempotency_key`` and
``INSERT … ON CONFLICT DO NOTHING``, then a read of the winner's id. Nothing is checked first
and inserted second, so concurrent enqueuers cannot both win.

The statements are built once per dialect and reused: SQLAlchemy then finds their compiled
form by the cache key it memoised on the statement, instead of building the construct and its
key again for every job. A batch goes to the dialect's bulk path when it has one (PostgreSQL
COPY, SQLite one statement per batch); otherwise to multi-row INSERTs. What each column gets
comes from ``sqlqueue._schema.ENQUEUE_COLUMNS``: the job row's values are bound by name, the
rest written by the statement.

They run on the caller's connection, so each carries the dialect's ``table_options`` itself
(the tables' schema), leaving the connection as the caller set it up.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    Float,
    Insert,
    Select,
    bindparam,
    func,
    insert,
    null,
    select,
)

from sqlqueue._errors import EnqueueError
from sqlqueue._jobrow import JobRow
from sqlqueue._schema import ENQUEUE_COLUMNS, ColumnKind, Fill, JobColumn, jobs
from sqlqueue._store._direct import DirectStatement, can_commit_directly, can_run_directly
from sqlqueue._store.bulk_copy import copy_jobs
from sqlqueue._store.bulk_json import insert_jobs_from_json
from sqlqueue._store.tags import write_tags
from sqlqueue._store.unique import UniqueOutcome, insert_unique, split_unique
from sqlqueue._types import EncodedJson, UtcDateTime
from sqlqueue._unique import UniqueCheck
from sqlqueue.dialects import BulkPath, Dialect

__all__ = ["insert_committed", "insert_rows", "insert_rows_reporting"]

#: A row with a unique key but no check (built by hand): ``Unique()``'s defaults.
_DEFAULT_CHECK = UniqueCheck(states=("queued", "running", "failed"), replace=False)

#: Keys per lookup of existing jobs (SQLite allows 32,766 bound values per statement).
_KEYS_PER_LOOKUP = 1000


@dataclass(frozen=True)
class _OneRow:
    """One row's ``INSERT … RETURNING id``: through SQLAlchemy, or straight to the driver."""

    statement: Insert
    direct: DirectStatement


@dataclass(frozen=True)
class _Statements:
    """The enqueue statements of one dialect; the rows' values are bound at execution."""

    one: _OneRow  # one row without a key: RETURNING its id
    one_keyed: _OneRow  # one row with a key: RETURNING its id, or nothing if the key exists
    #: ``one`` and ``one_keyed`` for a row due now (no ``run_at``, no delay), the common case:
    #: ``next_run_at`` is the clock itself, with nothing to bind or compute for it.
    one_now: _OneRow
    #: ``one_now`` for a row whose optional columns (:data:`_OPTIONAL`) are all ``None``, the
    #: most common case of all: they are left out and take their NULL default, so the driver
    #: binds six values fewer per job (``one_now`` writes the key's NULL as a literal).
    one_bare: _OneRow
    one_keyed_now: _OneRow
    many: Insert  # rows without keys: RETURNING ids in parameter order
    many_keyed: Insert  # rows with distinct keys: RETURNING id and key of those inserted
    existing: Select[Any]  # ids of the jobs holding some keys


#: Built on first use, per class and wake-up channel (which the statements name): one set
#: serves every queue of a class whose tables are in one schema.
_STATEMENTS: dict[tuple[type[Dialect], str], _Statements] = {}


def _statements(dialect: Dialect) -> _Statements:
    key = (type(dialect), dialect.wake_channel)
    found = _STATEMENTS.get(key)
    if found is None:
        found = _STATEMENTS[key] = _build_statements(dialect)
    return found


def _written_value(column: JobColumn, dialect: Dialect) -> Any:
    """What the INSERT writes into ``column``; ``None`` for a plain value of the job row, which
    is bound by its name from the row (the column's own type processes it)."""
    json = column.kind in (ColumnKind.JSON, ColumnKind.JSON_LIST)
    if column.fill is Fill.ROW:  # JSON arrives encoded, as text
        return bindparam(column.name, type_=EncodedJson()) if json else None
    if column.fill is Fill.CONSTANT:
        if json:
            return bindparam(f"sqlqueue_{column.name}", column.constant, type_=EncodedJson())
        return column.constant
    if column.fill is Fill.CLOCK:
        return dialect.clock()
    return func.coalesce(
        bindparam("_run_at", type_=UtcDateTime()),
        dialect.clock_plus(bindparam("_delay", type_=Float())),
        type_=UtcDateTime(),
    )


#: The column an enqueue computes from ``_run_at`` and ``_delay``: due now, it is the clock.
_DUE = next(column.name for column in ENQUEUE_COLUMNS if column.fill is Fill.DUE)
#: The row's columns that are NULL unless a feature sets them (idempotency key, group, trace,
#: batch, limit, unique key, expiry): nullable, with no default of their own.
_OPTIONAL = tuple(
    column.name
    for column in ENQUEUE_COLUMNS
    if column.fill is Fill.ROW
    and jobs.c[column.name].nullable
    and jobs.c[column.name].default is None
    and jobs.c[column.name].server_default is None
)


def _build_statements(dialect: Dialect) -> _Statements:
    clock = dialect.clock()
    values: dict[str, Any] = {}
    for column in ENQUEUE_COLUMNS:
        value = _written_value(column, dialect)
        if value is not None:
            values[column.name] = value
    wake = dialect.wake_columns()
    plain = insert(jobs).values(**values)
    keyed = dialect.insert_ignoring_duplicate_keys().values(**values)
    # One row without a key writes NULL itself instead of binding the row's ``None``; due now,
    # ``coalesce(NULL, clock + 0 s)`` is the clock: the same values, less to bind and evaluate.
    plain_one = plain.values({jobs.c.idempotency_key: null()})
    keyed_now = keyed.values({_DUE: clock})
    bare = insert(jobs).values(
        {name: value for name, value in values.items() if name not in _OPTIONAL} | {_DUE: clock}
    )
    return _Statements(
        one_bare=_one_row(bare.returning(jobs.c.id, *wake), leaving_out=_OPTIONAL),
        one=_one_row(plain_one.returning(jobs.c.id, *wake)),
        one_keyed=_one_row(keyed.returning(jobs.c.id, *wake)),
        one_now=_one_row(plain_one.values({_DUE: clock}).returning(jobs.c.id, *wake)),
        one_keyed_now=_one_row(keyed_now.returning(jobs.c.id, *wake)),
        many=plain.returning(jobs.c.id, *wake, sort_by_parameter_order=True),
        many_keyed=keyed.returning(jobs.c.id, jobs.c.idempotency_key, *wake),
        existing=select(jobs.c.idempotency_key, jobs.c.id).where(
            jobs.c.idempotency_key.in_(bindparam("keys", expanding=True))
        ),
    )


def _one_row(statement: Insert, leaving_out: tuple[str, ...] = ()) -> _OneRow:
    """``statement`` and its direct form, which binds the row's keys but ``leaving_out``."""
    keys = [key for key in JobRow.__required_keys__ if key not in leaving_out]
    return _OneRow(statement, DirectStatement(statement, keys))


def insert_rows(dialect: Dialect, conn: Connection, rows: Sequence[JobRow]) -> list[int]:
    """Insert checked rows on ``conn``; return one id per row (the existing id for a known key,
    the first row's id for a key repeated in the batch). Unique rows go one by one, in order,
    through :func:`~sqlqueue._store.unique.insert_unique` (a later row sees an earlier one)."""
    return [job_id for job_id, _ in insert_rows_reporting(dialect, conn, rows)]


def insert_committed(dialect: Dialect, engine: Engine, row: JobRow) -> int | None:
    """Insert one checked ``row`` in a transaction of its own on ``engine`` and commit it,
    straight on a pooled driver connection; its id, or ``None`` (nothing sent) where that
    does not apply: a row with a key, a unique key or tags (more than one statement), a
    dialect that emulates ``RETURNING``, or an engine whose listeners, logging or options
    ``engine.begin()`` would honour (see :func:`~sqlqueue._store._direct.can_commit_directly`).
    The caller then writes the row the usual way."""
    if (
        row["idempotency_key"] is not None
        or row["unique_key"] is not None
        or row.get("_tags")
        or dialect.emulates_returning
        or not can_commit_directly(engine)
    ):
        return None
    inserted = _one_for(dialect, row).direct.committed_row(engine, row, dialect.schema)
    if inserted is None:  # pragma: no cover - a plain INSERT … RETURNING returns its row
        raise EnqueueError("the database returned no id for an inserted job")
    return int(inserted[0])


def insert_rows_reporting(
    dialect: Dialect, conn: Connection, rows: Sequence[JobRow]
) -> list[tuple[int, UniqueOutcome]]:
    """:func:`insert_rows`, saying for each row whether it was inserted, or an existing unique
    job was kept or replaced (an idempotency key's existing job counts as inserted)."""
    if len(rows) == 1 and rows[0]["unique_key"] is None and not rows[0].get("_tags"):
        # One plain row (the one-job enqueue): no unique split, no tags to write.
        return [(_insert_one(dialect, conn, rows[0]), UniqueOutcome.INSERTED)]
    done = _insert_and_report(dialect, conn, rows)
    write_tags(
        dialect,
        conn,
        [
            (job_id, tag)
            for row, (job_id, outcome) in zip(rows, done, strict=True)
            if outcome is UniqueOutcome.INSERTED
            for tag in row.get("_tags", ())
        ],
    )
    return done


def _insert_and_report(
    dialect: Dialect, conn: Connection, rows: Sequence[JobRow]
) -> list[tuple[int, UniqueOutcome]]:
    plain, unique = split_unique(rows)
    if not unique:
        return [(job_id, UniqueOutcome.INSERTED) for job_id in _insert_plain(dialect, conn, rows)]
    done: list[tuple[int, UniqueOutcome]] = [(0, UniqueOutcome.INSERTED)] * len(rows)
    for index, job_id in zip(
        plain, _insert_plain(dialect, conn, [rows[i] for i in plain]), strict=True
    ):
        done[index] = (job_id, UniqueOutcome.INSERTED)
    for index in unique:
        row = rows[index]
        check = row.get("_unique") or _DEFAULT_CHECK
        done[index] = insert_unique(
            dialect, conn, row, check, lambda one: _insert_one(dialect, conn, one)
        )
    return done


def _insert_plain(dialect: Dialect, conn: Connection, rows: Sequence[JobRow]) -> list[int]:
    if not rows:
        return []
    if len(rows) == 1:
        return [_insert_one(dialect, conn, rows[0])]
    # Each key is written once, by its first row; ``slots`` maps every row to the written one.
    written: list[JobRow] = []
    slots: list[int] = []
    first_with_key: dict[str, int] = {}
    for row in rows:
        key = row["idempotency_key"]
        if key is None:
            slots.append(len(written))
            written.append(row)
        else:
            slot = first_with_key.setdefault(key, len(written))
            if slot == len(written):
                written.append(row)
            slots.append(slot)
    # The bulk paths carry no expiry (they compute every time column themselves): rows with
    # one go by multi-row INSERTs, which bind it like any column.
    expiring = any(row["expires_at"] is not None for row in written)
    ids = None if expiring else _insert_bulk(dialect, conn, written)
    if ids is None:
        ids = _insert_many(dialect, conn, written)
    taken = [
        row["idempotency_key"] for row, job_id in zip(written, ids, strict=True) if job_id is None
    ]
    if taken:
        existing = _existing_ids(dialect, conn, [key for key in taken if key is not None])
        ids = [
            existing[str(row["idempotency_key"])] if job_id is None else job_id
            for row, job_id in zip(written, ids, strict=True)
        ]
    return [_require(ids[slot]) for slot in slots]


def _insert_bulk(dialect: Dialect, conn: Connection, rows: list[JobRow]) -> list[int | None] | None:
    """``rows`` (distinct keys) by the dialect's bulk path; ``None`` if it has none for them."""
    path = dialect.bulk_path
    if path is BulkPath.COPY:
        return copy_jobs(dialect, conn, rows)
    if path is BulkPath.JSON_ARRAY:
        return insert_jobs_from_json(dialect, conn, rows)
    return None


def _one_for(dialect: Dialect, row: JobRow) -> _OneRow:
    """The one-row INSERT that writes ``row``: keyed or not, due now or later, bare or not."""
    statements = _statements(dialect)
    key = row["idempotency_key"]
    if row["_run_at"] is None and not row["_delay"]:
        if key is None:
            return statements.one_bare if _bare(row) else statements.one_now
        return statements.one_keyed_now
    return statements.one if key is None else statements.one_keyed


def _insert_one(dialect: Dialect, conn: Connection, row: JobRow) -> int:
    key = row["idempotency_key"]
    one = _one_for(dialect, row)
    if not dialect.emulates_returning and can_run_directly(conn):
        inserted = one.direct.first_row(conn, row, dialect.schema)
    else:
        inserted = dialect.execute_returning(
            conn, one.statement, row, execution_options=dialect.table_options
        ).first()
    if inserted is not None:
        return int(inserted[0])
    if key is None:  # pragma: no cover - a plain INSERT … RETURNING returns its row
        raise EnqueueError("the database returned no id for an inserted job")
    return _existing_ids(dialect, conn, [key])[key]


def _bare(row: JobRow) -> bool:
    """Whether every optional column of ``row`` is ``None``."""
    return (
        row["group_key"] is None
        and row["trace_context"] is None
        and row["batch_id"] is None
        and row["limit_key"] is None
        and row["unique_key"] is None
        and row["expires_at"] is None
    )


def _insert_many(dialect: Dialect, conn: Connection, rows: list[JobRow]) -> list[int | None]:
    """Multi-row INSERTs (SQLAlchemy sends up to 1,000 rows per statement): one id per row, or
    ``None`` where the row's key already exists. Keys in ``rows`` are distinct."""
    statements = _statements(dialect)
    ids: list[int | None] = [None] * len(rows)
    plain = [i for i, row in enumerate(rows) if row["idempotency_key"] is None]
    keyed = [i for i, row in enumerate(rows) if row["idempotency_key"] is not None]
    if plain:
        result = dialect.execute_returning(
            conn,
            statements.many,
            [rows[i] for i in plain],
            execution_options=dialect.table_options,
        )
        for index, job_id in zip(plain, result.scalars().all(), strict=True):
            ids[index] = int(job_id)
    if keyed:
        result = dialect.execute_returning(
            conn,
            statements.many_keyed,
            [rows[i] for i in keyed],
            execution_options=dialect.table_options,
        )
        by_key = {str(found[1]): int(found[0]) for found in result.all()}
        for index in keyed:
            ids[index] = by_key.get(str(rows[index]["idempotency_key"]))
    return ids


def _existing_ids(dialect: Dialect, conn: Connection, keys: list[str]) -> dict[str, int]:
    query = _statements(dialect).existing
    found: dict[str, int] = {}
    for start in range(0, len(keys), _KEYS_PER_LOOKUP):
        chunk = keys[start : start + _KEYS_PER_LOOKUP]
        found_rows = conn.execute(
            query, {"keys": chunk}, execution_options=dialect.table_options
        ).all()
        for key, job_id in found_rows:
            found[str(key)] = int(job_id)
    absent = [key for key in keys if key not in found]
    if absent:
        raise EnqueueError(
            f"idempotency key {absent[0]!r} conflicts with a job this transaction cannot see; "
            "enqueue under READ COMMITTED (the default) so the existing job's id can be returned"
        )
    return found


def _require(job_id: int | None) -> int:
    if job_id is None:  # pragma: no cover - every branch above fills its ids
        raise EnqueueError("the database returned no id for an inserted job")
    return job_id
