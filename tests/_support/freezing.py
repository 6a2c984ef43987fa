"""Freezing a worker process (SIGSTOP) at a moment it holds no open transaction.

A worker frozen inside one of its short transactions (a claim, a heartbeat, an upkeep write)
keeps that transaction open for as long as it stays frozen: on SQLite it holds the database's
only write lock, so no other process can claim, reap or even write a ledger row; on PostgreSQL
and MariaDB it holds row locks that other workers skip or wait on. A test of a *stalled*
worker then tests a lock held for ever instead. So the process is stopped, checked from the
database's side, and let run a moment and stopped again until the check passes.
"""

from __future__ import annotations

import signal
import sqlite3
import time
from pathlib import Path
from typing import Protocol

import sqlalchemy as sa

from tests._support.locks import innodb_transactions

__all__ = ["freeze_between_transactions"]


class _Signalled(Protocol):
    @property
    def pid(self) -> int: ...

    def send(self, sig: signal.Signals) -> None: ...


def _stopped(pid: int) -> bool:
    """Whether every thread of ``pid`` is stopped (state ``T`` in /proc): only then can no
    thread of it begin a transaction after the check."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
        states = [(task / "stat").read_text().rsplit(")", 1)[1].split()[0] for task in tasks]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return bool(states) and all(state in ("T", "t") for state in states)


def _sqlite_write_lock_free(engine: sa.Engine) -> bool:
    """Whether the SQLite file's write lock is free: ``BEGIN IMMEDIATE`` with a short busy
    timeout, rolled back at once. (A frozen reader does not block writers in WAL mode.)"""
    database = engine.url.database
    assert database, "a SQLite file database"
    conn = sqlite3.connect(database, timeout=0.05, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
    except sqlite3.OperationalError:
        return False
    finally:
        conn.close()
    return True


#: Other sessions of this test's database with a transaction open: since when, doing what.
_OPEN_TRANSACTIONS = (
    "SELECT xact_start, state, query FROM pg_stat_activity "
    "WHERE datname = current_database() AND pid <> pg_backend_pid() "
    "AND xact_start IS NOT NULL"
)


def _open_transactions(engine: sa.Engine) -> list[str]:
    """The transactions other sessions hold open in the test's own database (each test run
    has a database of its own, so those sessions are the test's worker processes). InnoDB's
    from its status report, read live: ``information_schema.innodb_trx`` may be a stale copy
    (see ``tests/_support/locks.py``), which showed none while one was open."""
    if engine.dialect.name == "sqlite":
        return [] if _sqlite_write_lock_free(engine) else ["a write transaction (BEGIN IMMEDIATE)"]
    if engine.dialect.name == "mysql":
        return [entry[:300] for entry in innodb_transactions(engine, database_only=True).values()]
    with engine.connect() as conn:
        rows = conn.execute(sa.text(_OPEN_TRANSACTIONS)).all()
    return [" | ".join(str(value) for value in row) for row in rows]


def freeze_between_transactions(worker: _Signalled, engine: sa.Engine, timeout: float = 30) -> None:
    """SIGSTOP ``worker`` at a moment it has no transaction open in ``engine``'s database.

    The other worker processes of the test must not be running yet (their transactions would
    count as the frozen one's). Fails the test if no such moment came within ``timeout``.
    """
    deadline = time.monotonic() + timeout
    open_ones: list[str] = []
    tries = 0
    while time.monotonic() < deadline:
        worker.send(signal.SIGSTOP)
        stop_deadline = time.monotonic() + 5
        while not _stopped(worker.pid) and time.monotonic() < stop_deadline:
            time.sleep(0.001)
        open_ones = _open_transactions(engine) if _stopped(worker.pid) else ["(not stopped)"]
        if not open_ones:
            return
        worker.send(signal.SIGCONT)
        # Long enough, on a loaded machine, for it to be scheduled and end the transaction:
        # stopped again at once, it would never get there.
        tries += 1
        time.sleep(min(0.01 * 2**tries, 0.5))
    raise AssertionError(
        f"worker {worker.pid} had a transaction open at every try for {timeout} s: {open_ones}"
    )
