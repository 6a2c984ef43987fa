"""Make the real database fail: a statement raises a real driver error, chosen by SQLAlchemy's
``before_cursor_execute`` event on the engine (sqlqueue itself is not touched).

:class:`FailStatements` fails the Nth (and following ``times - 1``) statements whose SQL matches
a pattern: deterministic, for in-process tests. :func:`fail_at_random` fails a seeded random
share of an engine's statements, for worker processes (tests/apps/flaky_app.py). An exception
raised there goes through SQLAlchemy's error handling exactly like one the driver raised
(wrapped in ``sqlalchemy.exc.OperationalError``; a disconnect invalidates the connection).
"""

from __future__ import annotations

import random
import re
import sqlite3
import threading
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

__all__ = ["FailStatements", "fail_at_random", "transient_error"]


def transient_error(dialect_name: str) -> BaseException:
    """A driver error a healthy database gives now and then, which sqlqueue does not retry
    inside the store (the worker must): SQLite busy past its timeout, a PostgreSQL
    serialization failure, a MariaDB connection lost mid-query (2013)."""
    if dialect_name == "sqlite":
        return sqlite3.OperationalError("database is locked")
    if dialect_name == "postgresql":
        import psycopg

        return psycopg.errors.SerializationFailure(
            "could not serialize access due to concurrent update"
        )
    import pymysql  # type: ignore[import-untyped]

    lost: BaseException = pymysql.err.OperationalError(2013, "Lost connection to MySQL server")
    return lost


class FailStatements:
    """While installed, the ``nth``..``nth + times - 1`` statements on ``engine`` matching
    ``pattern`` (a regular expression, searched case-insensitively) raise ``error()`` (by
    default :func:`transient_error` of the engine's backend) before they reach the database."""

    def __init__(
        self,
        engine: sa.Engine,
        pattern: str,
        *,
        nth: int = 1,
        times: int = 1,
        error: Callable[[], BaseException] | None = None,
    ) -> None:
        self.engine = engine
        self._pattern = re.compile(pattern, re.IGNORECASE | re.DOTALL)
        self._nth = nth
        self._times = times
        self._error = error or (lambda: transient_error(engine.dialect.name))
        self._lock = threading.Lock()
        #: Statements that matched so far, and how many of them were failed.
        self.matched = 0
        self.failed = 0
        #: Set when the first failure was raised.
        self.fired = threading.Event()

    def _before(self, _conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if not self._pattern.search(statement):
            return
        with self._lock:
            self.matched += 1
            if not self._nth <= self.matched < self._nth + self._times:
                return
            self.failed += 1
        self.fired.set()
        raise self._error()

    def __enter__(self) -> FailStatements:
        sa.event.listen(self.engine, "before_cursor_execute", self._before)
        return self

    def __exit__(self, *_exc: object) -> None:
        sa.event.remove(self.engine, "before_cursor_execute", self._before)


def fail_at_random(engine: sa.Engine, rate: float, seed: int) -> Callable[[], int]:
    """Make a ``rate`` share of the statements on ``engine`` raise :func:`transient_error`,
    drawn by ``random.Random(seed)``; returns a counter of the failures so far."""
    draw = random.Random(seed)
    lock = threading.Lock()
    failed = 0

    def before(conn: sa.Connection, *_args: Any) -> None:
        nonlocal failed
        with lock:
            if draw.random() >= rate:
                return
            failed += 1
        raise transient_error(conn.dialect.name)

    sa.event.listen(engine, "before_cursor_execute", before)
    return lambda: failed
