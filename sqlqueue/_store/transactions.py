"""Short transactions for the store: driver errors translated, writes committed or rolled back
as a unit (SQLite takes its write lock up front), reads ended as the dialect says.

Why PostgreSQL's reads commit (``Dialect.end_read``): psycopg forgets every server-side
prepared statement of a connection at each ROLLBACK it sends (a rollback may undo objects the
statements name), and a pooled connection whose transaction is still open when it goes back
to the pool is rolled back. A worker reads its queues' pauses every poll interval on the
connection its claims and completions use, so reads that rolled back made PostgreSQL parse
and plan those statements anew every few rounds (and never reach a generic plan). A
read-only transaction's COMMIT costs what its ROLLBACK did, and leaves the connection idle,
which psycopg's rollback at the pool's reset then passes over without a round trip."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

from sqlqueue.dialects import Dialect

__all__ = ["in_read", "in_write", "translated"]

T = TypeVar("T")


def translated(dialect: Dialect, operation: Callable[[], T]) -> T:
    """Run ``operation``, turning driver errors into sqlqueue errors."""
    try:
        return operation()
    except SQLAlchemyError as error:
        ours = dialect.translate_error(error)
        if ours is None:
            raise
        raise ours from error


def in_read(engine: Engine, dialect: Dialect, operation: Callable[[Connection], T]) -> T:
    """Run ``operation`` on a pooled connection, with driver errors translated, and end its
    transaction as the dialect says (PostgreSQL: COMMIT, see the module docstring); an error
    rolls it back."""

    def run() -> T:
        with engine.connect() as conn:
            result = operation(conn)
            dialect.end_read(conn)
            return result

    return translated(dialect, run)


def in_write(
    engine: Engine,
    dialect: Dialect,
    operation: Callable[[Connection], T],
    *,
    relaxed: bool = False,
    keep: Callable[[T], bool] = lambda _: True,
) -> T:
    """Run ``operation`` in one write transaction (SQLite: ``BEGIN IMMEDIATE``), with driver
    errors translated; commit if ``keep(result)``, else roll back.

    ``relaxed``: the commit need not wait for the disk (PostgreSQL ``synchronous_commit =
    off``, SQLite ``synchronous = NORMAL``) — for writes whose loss in a database crash
    at-least-once absorbs (a job runs again).

    The dialect runs the whole transaction again where its server aborted it over a lock
    conflict (MariaDB/MySQL deadlock victims, see ``Dialect.retry_transaction``).
    """

    def run() -> T:
        with engine.connect() as conn, dialect.write_transaction(conn, relaxed=relaxed):
            result = operation(conn)
            if keep(result):
                conn.commit()
            else:
                conn.rollback()
            return result

    return translated(dialect, lambda: dialect.retry_transaction(run))
