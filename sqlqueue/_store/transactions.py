"""Short transactions for the store: driver errors translated, writes committed or rolled back
as a unit (SQLite takes its write lock up front)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

from sqlqueue.dialects import Dialect

__all__ = ["in_write", "translated"]

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
