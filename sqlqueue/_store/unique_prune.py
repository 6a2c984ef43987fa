"""Retention of unique keys: the lock rows of keys that no job carries any more.

``sqlqueue_unique_keys`` gets a row the first time a key is enqueued, and enqueuers of that key
lock the row to take turns (see :mod:`sqlqueue._store.unique`). Once no job row carries the key
(its jobs were pruned) the row only costs space, and with a ``period`` every time bucket is a key
of its own: left alone, the table grows for ever. Retention walks it in key order, a batch per
transaction, and deletes the rows whose key no job carries. An enqueue that races the delete
writes its row again, so enqueuers of a key still take turns.
"""

from __future__ import annotations

from sqlalchemy import Connection, delete, exists, select

from sqlqueue._schema import jobs, unique_keys
from sqlqueue.dialects import Dialect

__all__ = ["prune_unique_keys"]


def prune_unique_keys(
    conn: Connection, dialect: Dialect, *, after: str, limit: int
) -> tuple[int, str | None]:
    """Look at the next ``limit`` keys after ``after`` (key order) and delete those no job
    carries; return how many went and the last key looked at, or ``None`` once the walk has
    reached the end of the table.

    The keys are selected with ``FOR UPDATE SKIP LOCKED`` where the backend has it, so the
    delete never waits on an enqueuer holding a key (nor deadlocks with one locking several).
    """
    options = dialect.table_options
    keys = (
        conn.execute(
            dialect.skip_locked(
                select(unique_keys.c.key)
                .where(unique_keys.c.key > after)
                .order_by(unique_keys.c.key)
                .limit(limit)
            ),
            execution_options=options,
        )
        .scalars()
        .all()
    )
    if not keys:
        return 0, None
    carried = exists().where(jobs.c.unique_key == unique_keys.c.key)
    deleted = conn.execute(
        delete(unique_keys).where(unique_keys.c.key.in_(keys), ~carried),
        execution_options=options,
    ).rowcount
    return deleted, (keys[-1] if len(keys) == limit else None)
