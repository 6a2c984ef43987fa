"""Enqueue of unique jobs: the database decides which of concurrent enqueuers writes.

For each unique row: write its key into ``sqlqueue_unique_keys`` if absent and lock that row
(PostgreSQL and MariaDB/MySQL row locks; SQLite's write lock serialises writers anyway), so
enqueuers of one key take turns until their transactions end. Under the lock, look for a job
with the key whose status is one the task's ``Unique.states`` name: none, and the row is
inserted; one, and it is kept (its id returned, nothing written) or, with ``replace``, given
the new payload and run time if it is still ``queued``. A job that leaves the states frees the
key by that alone: no status change anywhere has to know about uniqueness. A key derived from
a secret field has one digest per encryption key (sqlqueue/_secret_keys.py): all of them are
locked and looked for, so a rotation does not let a duplicate through.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, Float, bindparam, func, select, update

from sqlqueue._errors import DatabaseError
from sqlqueue._jobrow import JobRow
from sqlqueue._schema import jobs, unique_keys
from sqlqueue._types import EncodedJson, UtcDateTime
from sqlqueue._unique import UniqueCheck
from sqlqueue.dialects import Dialect

__all__ = ["UniqueOutcome", "insert_unique"]

#: How often an enqueue writes its key's lock row again when retention pruned it meanwhile.
_LOCK_TRIES = 5


class UniqueOutcome(enum.Enum):
    """What an enqueue of a unique job did."""

    INSERTED = "inserted"
    KEPT = "kept"
    REPLACED = "replaced"


def insert_unique(
    dialect: Dialect,
    conn: Connection,
    row: JobRow,
    check: UniqueCheck,
    insert: Any,
) -> tuple[int, UniqueOutcome]:
    """Enqueue ``row`` (which has a ``unique_key``) under its key's lock; ``insert`` writes it
    when no job holds the key. Returns the job's id and what happened."""
    key = row["unique_key"]
    assert key is not None  # split_unique sends only the rows that have one
    options = dialect.table_options
    # A key derived from a secret field is held under one digest per encryption key (a job
    # enqueued before a rotation has an older one): each is locked, in one order for every
    # enqueuer, so two whose key rings share a key take turns as one key's enqueuers do.
    keys = sorted({key, *check.also}) if check.also else [key]
    for each in keys:
        _lock_key(dialect, conn, each)
    held = jobs.c.unique_key == key if len(keys) == 1 else jobs.c.unique_key.in_(keys)
    found = conn.execute(
        dialect.lock_row(
            select(jobs.c.id, jobs.c.status)
            .where(held, jobs.c.status.in_(check.states))
            .order_by(jobs.c.id.desc())
            .limit(1)
        ),
        execution_options=options,
    ).first()
    if found is None:
        return int(insert(row)), UniqueOutcome.INSERTED
    job_id = int(found[0])
    if check.replace and found[1] == "queued" and _replace(dialect, conn, job_id, row):
        return job_id, UniqueOutcome.REPLACED
    return job_id, UniqueOutcome.KEPT


def _lock_key(dialect: Dialect, conn: Connection, key: str) -> None:
    """Write ``key``'s row in ``sqlqueue_unique_keys`` if absent, and lock it."""
    options = dialect.table_options
    # Executed as it is (not through ``execute_returning``): on MariaDB/MySQL this is the no-op
    # ``ON DUPLICATE KEY UPDATE``, which takes the existing row's exclusive lock at once; an
    # INSERT that fails on the duplicate takes a shared lock first, and two enqueuers then
    # deadlock upgrading theirs.
    for _ in range(_LOCK_TRIES):
        conn.execute(
            dialect.conflict_insert(unique_keys)
            .values(key=key)
            .on_conflict_do_nothing(index_elements=[unique_keys.c.key]),
            execution_options=options,
        )
        locked = conn.execute(
            dialect.lock_row(select(unique_keys.c.key).where(unique_keys.c.key == key)),
            execution_options=options,
        ).first()
        if locked is not None:
            return
        # Retention pruned the key's row between the two statements (it holds no job): write
        # it again, so concurrent enqueuers of the key still take turns on its lock.
    raise DatabaseError(f"the lock row of unique key {key!r} kept vanishing")


def _replace(dialect: Dialect, conn: Connection, job_id: int, row: JobRow) -> bool:
    """Give the queued job ``job_id`` the payload and run time of ``row``; ``False`` if it is no
    longer queued (a claim took it first)."""
    clock = dialect.clock()
    due = func.coalesce(
        bindparam("_run_at", type_=UtcDateTime()),
        dialect.clock_plus(bindparam("_delay", type_=Float())),
        type_=UtcDateTime(),
    )
    result = conn.execute(
        update(jobs)
        .where(jobs.c.id == bindparam("_id"), jobs.c.status == "queued")
        .values(
            payload=bindparam("payload", type_=EncodedJson()),
            next_run_at=due,
            updated_at=clock,
        ),
        {
            "_id": job_id,
            "payload": row["payload"],
            "_run_at": row["_run_at"],
            "_delay": row["_delay"],
        },
        execution_options=dialect.table_options,
    )
    return result.rowcount == 1


def split_unique(rows: Sequence[JobRow]) -> tuple[list[int], list[int]]:
    """The positions of the rows without a unique key, and of those with one."""
    plain = [i for i, row in enumerate(rows) if row["unique_key"] is None]
    unique = [i for i, row in enumerate(rows) if row["unique_key"] is not None]
    return plain, unique
