"""Two apps on one MariaDB server, each in a database of its own, never wait for each other.

``GET_LOCK`` names and ``information_schema.innodb_trx`` are the server's, not a database's:
sqlqueue's named locks (a conflict key's turn, the migration lock) and its oldest-open-write
lookup must keep to the session's own database. A neighbour that held one of ours would stall
an enqueue for up to 60 s, a migration for up to 120 s, or the counts' fold for as long as its
transaction stays open. (The parallel test suite is such a server: a database per worker.)
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa

import sqlqueue
from sqlqueue.dialects import _mysql_open_writes as open_writes
from sqlqueue.dialects import dialect_for
from tests._support import wait_until
from tests.conftest import _mysql_database, _reset_mysql

#: Long enough for the other database's work on a loaded machine, well under the 60 s a
#: conflict key's turn and the 120 s the migration lock would make it wait if it were shared.
PROMPTLY = 40.0


@pytest.fixture
def home(mysql_url: str) -> Iterator[sa.Engine]:
    """The session's MariaDB database, emptied and migrated."""
    _reset_mysql(mysql_url)
    engine = sa.create_engine(mysql_url)
    sqlqueue.migrate(engine)
    yield engine
    engine.dispose()


@pytest.fixture
def neighbour(worker_id: str) -> Iterator[sa.Engine]:
    """A second database on the same server: another app's, empty."""
    for url in _mysql_database(f"{worker_id}_neighbour"):
        engine = sa.create_engine(url)
        yield engine
        engine.dispose()


def _in_thread(work: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """Start ``work`` on a thread; the list gets its result or the exception it raised."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(work())
        except Exception as error:  # handed to the test, which names what it expected
            outcome.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def _queue(engine: sa.Engine) -> sqlqueue.Queue:
    queue = sqlqueue.Queue(engine)

    @queue.task("ping")
    def ping() -> None:
        """Never run: the test only enqueues."""

    return queue


def test_a_conflict_key_held_in_one_database_does_not_stall_the_same_key_in_another(
    home: sa.Engine, neighbour: sa.Engine
) -> None:
    sqlqueue.migrate(neighbour)
    here, there = _queue(home), _queue(neighbour)
    held: list[tuple[threading.Thread, list[Any]]] = []

    def meanwhile(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        # Right after this session took the key's turn, and while it holds it.
        if "GET_LOCK" in statement.upper() and not held:
            held.append(_in_thread(lambda: _enqueue(there, "shared-key")))
            held[0][0].join(PROMPTLY)

    sa.event.listen(home, "after_cursor_execute", meanwhile)
    try:
        mine = _enqueue(here, "shared-key")
    finally:
        sa.event.remove(home, "after_cursor_execute", meanwhile)

    assert held, "the enqueue took no named lock: this test tests nothing"
    (thread, outcome) = held[0]
    assert not thread.is_alive(), "the other database's enqueue waited for this one's key"
    assert len(outcome) == 1, outcome
    assert isinstance(outcome[0], int), outcome
    assert isinstance(mine, int)


def _enqueue(queue: sqlqueue.Queue, key: str) -> int:
    with queue.engine.begin() as conn:
        return queue.enqueue(conn, "ping", idempotency_key=key)


def test_a_migration_of_one_database_does_not_wait_for_another(
    home: sa.Engine, neighbour: sa.Engine
) -> None:
    dialect = dialect_for(home)
    with home.connect() as conn, dialect.migration_lock(conn):
        # Control: a second migration of the same database waits for the lock...
        same, same_outcome = _in_thread(lambda: sqlqueue.migrate(home))
        # ...and one of the neighbour's database does not.
        other, other_outcome = _in_thread(lambda: sqlqueue.migrate(neighbour))
        other.join(PROMPTLY)
        assert not other.is_alive(), "the other database's migration waited for our lock"
        assert other_outcome == [None]
        assert same.is_alive(), same_outcome
        assert same_outcome == []
    same.join(PROMPTLY)
    assert same_outcome == [None]
    assert "sqlqueue_jobs" in sa.inspect(neighbour).get_table_names()


def test_an_open_write_in_another_database_does_not_hold_back_ours(
    home: sa.Engine, neighbour: sa.Engine
) -> None:
    for engine in (home, neighbour):
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE test_rows (id INT PRIMARY KEY)")

    # InnoDB serves information_schema.innodb_trx from a cache that it refreshes only when the
    # last read is over 0.1 s old (polling faster keeps it stale for ever): each check first
    # waits, reading every 0.25 s, until the table shows that session's open write, so a stale
    # read can neither pass the first check nor fail the control.
    with neighbour.connect() as theirs:
        theirs.exec_driver_sql("BEGIN")
        theirs.exec_driver_sql("INSERT INTO test_rows VALUES (1)")
        with home.connect() as conn:
            wait_until(lambda: _shows_write(conn, of=theirs), what="their write", interval=0.25)
            assert _oldest_open_write(conn) is None
        theirs.rollback()

    # Control: an open write in our own database is seen.
    with home.connect() as ours:
        ours.exec_driver_sql("BEGIN")
        ours.exec_driver_sql("INSERT INTO test_rows VALUES (1)")
        with home.connect() as conn:
            wait_until(lambda: _shows_write(conn, of=ours), what="our write", interval=0.25)
            assert _oldest_open_write(conn) is not None
        ours.rollback()


def _oldest_open_write(conn: sa.Connection) -> object:
    """The oldest open write as a fold reads it, from a transaction that holds a row lock (a
    row of its own: the other sessions' rows are theirs), once InnoDB's copy of its
    transactions is fresh: a parallel test worker's reads may keep it stale for a while, and a
    fold then answers cautiously (``sqlqueue/dialects/_mysql_open_writes.py``)."""
    conn.rollback()  # the reads before it
    conn.begin()
    try:
        conn.exec_driver_sql("INSERT INTO test_rows VALUES (2)")
        copies: list[Any] = []

        def fresh() -> bool:
            copies.append(open_writes.read_copy(conn))
            return bool(copies[-1].fresh)

        wait_until(fresh, what="a fresh copy of InnoDB's transactions", interval=0.25)
        return copies[-1].oldest_write
    finally:
        conn.rollback()


def _shows_write(conn: sa.Connection, *, of: sa.Connection) -> bool:
    """Whether innodb_trx, as the server shows it now, has the open write of session ``of``."""
    session = of.exec_driver_sql("SELECT CONNECTION_ID()").scalar_one()
    shown = conn.exec_driver_sql(
        "SELECT COUNT(*) FROM information_schema.innodb_trx "
        "WHERE trx_mysql_thread_id = %s AND trx_rows_modified > 0",
        (session,),
    ).scalar_one()
    return bool(shown)
