"""``python -m bench.faults_worker RATE SEED ARGS…``: ``python -m sqlqueue ARGS…`` whose
statements fail at random, for bench/faults.py.

A ``before_cursor_execute`` listener on every engine of the process raises a real driver
exception for a share ``RATE`` of the statements (a ``random.Random(SEED)`` draws which), from
the moment the worker says it serves (so a burst worker's first read of the paused queues,
which stops it by design when the database cannot be reached, is spared). The exceptions are
what a database under stress gives a driver:

- SQLite: ``sqlite3.OperationalError("database is locked")``;
- PostgreSQL (psycopg 3): ``SerializationFailure``, ``LockNotAvailable`` (a lock timeout) and
  ``OperationalError("server closed the connection unexpectedly")`` (a dropped connection,
  which SQLAlchemy also treats as one: the connection is thrown away), in turn;
- MariaDB/MySQL (PyMySQL): ``OperationalError`` 1213 (deadlock) and 1205 (lock wait timeout).

At exit it prints ``bench.faults_worker: failed N of M statements`` on stderr.
"""

from __future__ import annotations

import atexit
import logging
import random
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa

__all__ = ["Injector", "driver_errors", "main"]


def driver_errors(dialect_name: str) -> list[Callable[[], BaseException]]:
    """Makers of the transient driver exceptions of one backend, used in turn."""
    if dialect_name == "sqlite":
        import sqlite3

        return [lambda: sqlite3.OperationalError("database is locked")]
    if dialect_name == "postgresql":
        import psycopg

        return [
            lambda: psycopg.errors.SerializationFailure(
                "could not serialize access due to concurrent update"
            ),
            lambda: psycopg.errors.LockNotAvailable("canceling statement due to lock timeout"),
            lambda: psycopg.OperationalError(
                "server closed the connection unexpectedly\n\tThis probably means the server "
                "terminated abnormally"
            ),
        ]
    import pymysql  # type: ignore[import-untyped]

    return [
        lambda: pymysql.err.OperationalError(1213, "Deadlock found when trying to get lock"),
        lambda: pymysql.err.OperationalError(1205, "Lock wait timeout exceeded"),
    ]


class Injector:
    """Fails a seeded random share of the statements of every engine, once armed."""

    def __init__(self, rate: float, seed: int) -> None:
        self.rate = rate
        self.armed = False
        #: The worker said it serves: arm at its first statement on the jobs table (its claim).
        self.serving = False
        self.statements = 0
        self.failed = 0
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self._turn = 0

    def install(self) -> None:
        """Listen on every engine made from now on (and those made already)."""
        sa.event.listen(sa.Engine, "before_cursor_execute", self._before)

    def _before(self, conn: sa.Connection, _cursor: Any, statement: str, *_args: Any) -> None:
        if not self.armed:
            self.armed = self.serving and "sqlqueue_jobs" in statement
            if not self.armed:
                return
        with self._lock:
            self.statements += 1
            if self._random.random() >= self.rate:
                return
            self.failed += 1
            makers = driver_errors(conn.dialect.name)
            self._turn += 1
            error = makers[self._turn % len(makers)]()
        raise error

    def report(self) -> None:
        print(
            f"bench.faults_worker: failed {self.failed} of {self.statements} statements",
            file=sys.stderr,
            flush=True,
        )


class _ArmOnServing(logging.Handler):
    """Arms the injector when the worker logs that it serves (just before its first claim)."""

    def __init__(self, injector: Injector) -> None:
        super().__init__(logging.INFO)
        self._injector = injector

    def emit(self, record: logging.LogRecord) -> None:
        if "serving queues" in str(record.msg):
            self._injector.serving = True


def main(argv: Sequence[str]) -> int:
    """Install the injector at ``argv[0]`` (rate) and ``argv[1]`` (seed); run the rest."""
    rate, seed, *rest = argv
    injector = Injector(float(rate), int(seed))
    if injector.rate > 0:
        injector.install()
        logging.getLogger("sqlqueue.worker").addHandler(_ArmOnServing(injector))
        atexit.register(injector.report)
    from sqlqueue.cli import main as sqlqueue_main

    return sqlqueue_main(rest)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
