"""Two transactions meeting on a row: which database session waits for a row lock now (the
server's own view of its sessions), and :func:`overlap`, which holds one write transaction open
until a second one, started in a thread, waits for it, and only then commits the first.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from sqlqueue._store.transactions import in_write
from sqlqueue.dialects import Dialect
from tests._support.waiting import wait_until

__all__ = [
    "Overlap",
    "innodb_transactions",
    "overlap",
    "session_id",
    "session_state",
    "someone_waits_for_a_lock",
    "waiting_for_a_lock",
]


def waiting_for_a_lock(engine: sa.Engine, session: int) -> bool:
    """Whether database session ``session`` waits for a row lock now (the server's own view
    of its sessions: ``pg_stat_activity``; InnoDB's transactions as its status report lists
    them, read live: ``information_schema.innodb_trx`` is a copy InnoDB refreshes only once
    nobody has read it for 0.1 s, which a poll every 20 ms, or parallel tests' polls, never
    allow, so it went on showing the session before it waited)."""
    if engine.dialect.name == "postgresql":
        query = "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = :id"
        with engine.connect() as conn:
            return bool(conn.execute(sa.text(query), {"id": session}).scalar())
    return "LOCK WAIT" in _innodb_transaction(engine, session)


def someone_waits_for_a_lock(engine: sa.Engine) -> bool:
    """Whether another session of ``engine``'s database waits for a row lock now, whichever
    it is (a test that cannot name the session an operation will wait in: one of its own
    transactions, on a pooled connection); the server's own view, as
    :func:`waiting_for_a_lock` reads it."""
    if engine.dialect.name == "postgresql":
        query = (
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND wait_event_type = 'Lock'"
        )
        with engine.connect() as conn:
            return bool(conn.execute(sa.text(query)).scalar())
    transactions = innodb_transactions(engine, database_only=True)
    return any("LOCK WAIT" in entry for entry in transactions.values())


def _innodb_transaction(engine: sa.Engine, session: int) -> str:
    """The entry of ``session``'s transaction in InnoDB's status report ("" if it has none)."""
    return innodb_transactions(engine).get(session, "")


def innodb_transactions(engine: sa.Engine, *, database_only: bool = False) -> dict[int, str]:
    """The open InnoDB transactions by database session, each with its entry in InnoDB's
    status report, which is read live (unlike ``information_schema.innodb_trx``, see
    :func:`waiting_for_a_lock`); with ``database_only``, only those of other sessions of
    ``engine``'s database (``processlist`` is live too)."""
    with engine.connect() as conn:
        report = str(conn.exec_driver_sql("SHOW ENGINE INNODB STATUS").one()[2])
        sessions = {
            int(session)
            for (session,) in conn.exec_driver_sql(
                "SELECT id FROM information_schema.processlist "
                "WHERE db = DATABASE() AND id <> CONNECTION_ID()"
            )
        }
    found: dict[int, str] = {}
    for entry in report.split("\n---TRANSACTION ")[1:]:
        session = re.search(r" thread id (\d+),", entry)
        if session is None or ", not started" in entry.split("\n", 1)[0]:
            continue
        if not database_only or int(session[1]) in sessions:
            found[int(session[1])] = entry
    return found


def session_state(engine: sa.Engine, session: int) -> str:
    """What database session ``session`` is doing now, as the server reports it (for a
    failure's message)."""
    if engine.dialect.name == "postgresql":
        query = (
            "SELECT state, wait_event_type, wait_event, query FROM pg_stat_activity WHERE pid = :id"
        )
        with engine.connect() as conn:
            return repr(conn.execute(sa.text(query), {"id": session}).all())
    return _innodb_transaction(engine, session)[:600] or "no InnoDB transaction"


def session_id(conn: sa.Connection) -> int:
    """The database session ``conn`` talks to (PostgreSQL's backend pid, MySQL's connection
    id), as :func:`waiting_for_a_lock` names it."""
    query = (
        "SELECT pg_backend_pid()" if conn.dialect.name == "postgresql" else "SELECT CONNECTION_ID()"
    )
    return int(conn.exec_driver_sql(query).scalar_one())


@dataclass
class Overlap:
    """What :func:`overlap` saw: the held transaction's result, the other's (none if it
    raised), every error either side raised, and whether the server showed the other waiting
    for a lock (the two really overlapped; never without row locks)."""

    held: Any = None
    other: list[Any] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)
    waited: bool = False


def overlap(
    engine: sa.Engine,
    dialect: Dialect,
    held: Callable[[sa.Connection], Any],
    other: Callable[[sa.Connection], Any],
) -> Overlap:
    """Run ``held`` in a write transaction and keep it open; meanwhile start ``other`` in a
    thread, in a write transaction of its own as the store runs each operation (``in_write``:
    errors translated, MariaDB's deadlock victims run again). Once ``other`` waits for a row
    lock (or has ended) commit ``held``'s transaction, so ``other`` goes on from what it
    committed. Without row locks (SQLite) ``other`` is only started first: the one writer
    makes it wait for the commit all the same."""
    seen = Overlap()
    session: list[int] = []
    started = threading.Event()

    def noted(conn: sa.Connection) -> Any:
        if dialect.supports_row_locks:
            session.append(session_id(conn))
        return other(conn)

    def run_other() -> None:
        started.set()
        try:
            seen.other.append(in_write(engine, dialect, noted))
        except BaseException as error:
            seen.errors.append(error)

    def waits() -> bool:
        if seen.other or seen.errors:
            return True
        if not dialect.supports_row_locks:
            return started.is_set()
        seen.waited = bool(session) and waiting_for_a_lock(engine, session[-1])
        return seen.waited

    thread = threading.Thread(target=run_other, daemon=True)
    with engine.connect() as conn, dialect.write_transaction(conn):
        try:
            seen.held = held(conn)
            thread.start()
            wait_until(
                waits,
                timeout=20,
                what="the other transaction to wait for a lock",
                explain=lambda: (
                    f"session {session[-1]}: {session_state(engine, session[-1])}"
                    if session
                    else "it has not begun"
                ),
            )
        except BaseException as error:
            seen.errors.append(error)
            conn.rollback()
        else:
            conn.commit()
    thread.join(30)
    assert not thread.is_alive(), "the other transaction never ended"
    return seen
