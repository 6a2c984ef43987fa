"""INSERTs of job rows, plain and idempotent, one or thousands per round trip.

Idempotency is the database's job: a unique index on ``idempotency_key`` and
``INSERT … ON CONFLICT DO NOTHING``, then a read of the winner's id. Nothing is checked first
and inserted second, so concurrent enqueuers cannot both win.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, Float, bindparam, func, insert, select

from sqlqueue._errors import EnqueueError
from sqlqueue._schema import jobs
from sqlqueue._types import UtcDateTime
from sqlqueue.dialects import Dialect

__all__ = ["insert_rows"]


def _timestamps(dialect: Dialect) -> dict[str, Any]:
    clock = dialect.clock()
    due = func.coalesce(
        bindparam("_run_at", type_=UtcDateTime()),
        dialect.clock_plus(bindparam("_delay", type_=Float())),
        type_=UtcDateTime(),
    )
    return {"created_at": clock, "updated_at": clock, "next_run_at": due}


def insert_rows(dialect: Dialect, conn: Connection, rows: list[dict[str, Any]]) -> list[int]:
    """Insert checked rows on ``conn``; return one id per row (the existing id for a known key)."""
    ids: list[int | None] = [None] * len(rows)
    plain = [i for i, row in enumerate(rows) if row["idempotency_key"] is None]
    keyed = [i for i, row in enumerate(rows) if row["idempotency_key"] is not None]
    if len(rows) == 1:
        ids[0] = _insert_one(dialect, conn, rows[0])
    else:
        if plain:
            stmt = (
                insert(jobs)
                .values(**_timestamps(dialect))
                .returning(jobs.c.id, *dialect.wake_columns(), sort_by_parameter_order=True)
            )
            result = conn.execute(stmt, [rows[i] for i in plain])
            for index, job_id in zip(plain, result.scalars().all(), strict=True):
                ids[index] = job_id
        if keyed:
            _insert_keyed(dialect, conn, rows, keyed, ids)
    return [_require(job_id) for job_id in ids]


def _insert_one(dialect: Dialect, conn: Connection, row: dict[str, Any]) -> int:
    key = row["idempotency_key"]
    if key is None:
        stmt = insert(jobs).values(**_timestamps(dialect))
        return int(conn.execute(stmt.returning(jobs.c.id, *dialect.wake_columns()), row).one()[0])
    keyed = dialect.insert_ignoring_duplicate_keys().values(**_timestamps(dialect))
    inserted = conn.execute(keyed.returning(jobs.c.id, *dialect.wake_columns()), row).first()
    if inserted is not None:
        return int(inserted[0])
    return _existing_ids(conn, [key])[key]


def _insert_keyed(
    dialect: Dialect,
    conn: Connection,
    rows: list[dict[str, Any]],
    keyed: list[int],
    ids: list[int | None],
) -> None:
    first_with_key: dict[str, int] = {}
    for index in keyed:
        first_with_key.setdefault(rows[index]["idempotency_key"], index)
    stmt = (
        dialect.insert_ignoring_duplicate_keys()
        .values(**_timestamps(dialect))
        .returning(jobs.c.id, jobs.c.idempotency_key, *dialect.wake_columns())
    )
    result = conn.execute(stmt, [rows[i] for i in first_with_key.values()])
    by_key = {row[1]: int(row[0]) for row in result.all()}
    missing = [key for key in first_with_key if key not in by_key]
    if missing:
        by_key.update(_existing_ids(conn, missing))
    for index in keyed:
        ids[index] = by_key[rows[index]["idempotency_key"]]


def _existing_ids(conn: Connection, keys: list[str]) -> dict[str, int]:
    query = select(jobs.c.idempotency_key, jobs.c.id).where(jobs.c.idempotency_key.in_(keys))
    found = {str(key): int(job_id) for key, job_id in conn.execute(query).all()}
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
