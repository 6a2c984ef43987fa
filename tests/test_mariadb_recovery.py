"""MariaDB's recovery paths, against MariaDB itself: a write transaction that InnoDB aborts
(deadlock victim 1213, lock wait timeout 1205) runs again and succeeds; an error that must not
be retried is not; "cannot reach the server" becomes ``DatabaseUnavailable``.

Real deadlocks and lock waits are provoked with two connections; the rest by error code (a
real PyMySQL exception raised from SQLAlchemy's ``before_cursor_execute``, see
tests/apps/statement_faults.py).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pymysql  # type: ignore[import-untyped]
import pytest
import sqlalchemy as sa

import sqlqueue
from sqlqueue._store.transactions import in_write
from sqlqueue.dialects import dialect_for
from tests._support import wait_until
from tests._support.locks import waiting_for_a_lock
from tests.apps.statement_faults import FailStatements

ROWS = 50


@pytest.fixture
def engine(mysql_url: str) -> Iterator[sa.Engine]:
    """The session's MariaDB database with a table of ``ROWS`` counters."""
    made = sa.create_engine(mysql_url)
    with made.begin() as conn:
        conn.exec_driver_sql("DROP TABLE IF EXISTS test_counters")
        conn.exec_driver_sql("CREATE TABLE test_counters (id INT PRIMARY KEY, n INT NOT NULL)")
        conn.exec_driver_sql(
            "INSERT INTO test_counters VALUES " + ", ".join(f"({i}, 0)" for i in range(1, ROWS + 1))
        )
    yield made
    with made.begin() as conn:
        conn.exec_driver_sql("DROP TABLE IF EXISTS test_counters")
    made.dispose()


def _bump(conn: sa.Connection, row: int) -> None:
    """One counter up, by primary key: InnoDB locks that row alone."""
    conn.execute(sa.text("UPDATE test_counters SET n = n + 1 WHERE id = :id"), {"id": row})


def _counts(engine: sa.Engine) -> dict[int, int]:
    with engine.connect() as conn:
        rows = conn.exec_driver_sql("SELECT id, n FROM test_counters").all()
    return {int(row[0]): int(row[1]) for row in rows}


def test_a_deadlock_victim_is_run_again_and_then_succeeds(engine):
    dialect = dialect_for(engine)
    first_locked = threading.Event()
    others_locked = threading.Event()
    errors: list[BaseException] = []
    heavy_id: list[int] = []

    def heavy() -> None:
        """Locks rows 2..ROWS (many: InnoDB picks the lighter transaction as the victim), then
        wants row 1, which the other transaction holds: a lock cycle."""
        try:
            with engine.connect() as conn, conn.begin():
                conn.exec_driver_sql("SET SESSION innodb_lock_wait_timeout = 20")
                heavy_id.append(int(conn.exec_driver_sql("SELECT CONNECTION_ID()").scalar_one()))
                for row in range(2, ROWS + 1):  # one by one: a row lock each, no scan
                    _bump(conn, row)
                others_locked.set()
                assert first_locked.wait(20)
                _bump(conn, 1)
        except BaseException as error:
            errors.append(error)

    tries = 0

    def light(conn: sa.Connection) -> None:
        nonlocal tries
        tries += 1
        _bump(conn, 1)
        if tries == 1:
            assert others_locked.wait(20), errors
            first_locked.set()
            wait_until(
                lambda: waiting_for_a_lock(engine, heavy_id[0]),
                what="the heavy transaction to wait for row 1",
            )
        _bump(conn, 2)  # waits for the heavy one: the cycle closes, this one is the victim

    thread = threading.Thread(target=heavy)
    thread.start()
    try:
        in_write(engine, dialect, light)
    finally:
        thread.join(30)
    assert not errors, errors
    assert tries == 2  # aborted once as the deadlock victim, then run again
    counts = _counts(engine)
    assert (counts[1], counts[2], counts[3]) == (2, 2, 1)  # each transaction landed once


def test_a_lock_wait_timeout_is_run_again_and_then_succeeds(engine):
    dialect = dialect_for(engine)
    holding = threading.Event()
    retrying = threading.Event()

    def hold_row_one() -> None:
        with engine.connect() as conn, conn.begin():
            _bump(conn, 1)
            holding.set()
            # Held until the waiter's first try timed out (its 1 s lock wait) and it tries again.
            assert retrying.wait(30)

    thread = threading.Thread(target=hold_row_one)
    thread.start()
    assert holding.wait(20)
    tries = 0

    def waiter(conn: sa.Connection) -> None:
        nonlocal tries
        tries += 1
        if tries == 2:
            retrying.set()
        # The first try times out after 1 s; the second waits for the holder's commit.
        wait = 1 if tries == 1 else 20
        conn.exec_driver_sql(f"SET SESSION innodb_lock_wait_timeout = {wait}")
        _bump(conn, 1)

    try:
        in_write(engine, dialect, waiter)
    finally:
        thread.join(30)
    assert tries == 2
    assert _counts(engine)[1] == 2


def test_a_duplicate_key_is_not_retried_and_is_a_database_error(engine):
    dialect = dialect_for(engine)
    tries = 0

    def insert_twice(conn: sa.Connection) -> None:
        nonlocal tries
        tries += 1
        conn.exec_driver_sql("INSERT INTO test_counters VALUES (1, 0)")

    with pytest.raises(sqlqueue.DatabaseError, match="Duplicate entry") as raised:
        in_write(engine, dialect, insert_twice)
    assert not isinstance(raised.value, sqlqueue.DatabaseUnavailable)
    assert tries == 1


@pytest.mark.parametrize(
    ("code", "message"),
    [(1213, "Deadlock found when trying to get lock"), (1205, "Lock wait timeout exceeded")],
)
def test_lock_conflict_codes_are_retried_until_the_transaction_lands(engine, code, message):
    dialect = dialect_for(engine)
    tries = 0

    def bump(conn: sa.Connection) -> None:
        nonlocal tries
        tries += 1
        _bump(conn, 7)

    error = lambda: pymysql.err.OperationalError(code, message)  # noqa: E731
    with FailStatements(engine, "UPDATE test_counters", times=2, error=error) as failing:
        in_write(engine, dialect, bump)
    assert (failing.failed, tries) == (2, 3)
    assert _counts(engine)[7] == 1


def test_a_lock_conflict_that_outlives_the_retries_is_database_unavailable(engine):
    dialect = dialect_for(engine)
    error = lambda: pymysql.err.OperationalError(1213, "Deadlock found")  # noqa: E731
    with (
        FailStatements(engine, "UPDATE test_counters", times=10**6, error=error) as failing,
        pytest.raises(sqlqueue.DatabaseUnavailable, match="kept refusing a transaction over locks"),
    ):
        in_write(engine, dialect, lambda conn: _bump(conn, 7))
    assert failing.failed == 5  # the dialect's tries, then the error
    assert _counts(engine)[7] == 0


@pytest.mark.parametrize(
    ("code", "message"),
    [(1317, "Query execution was interrupted"), (1146, "Table 'test.nope' doesn't exist")],
)
def test_other_codes_are_not_retried(engine, code, message):
    dialect = dialect_for(engine)
    error = lambda: pymysql.err.OperationalError(code, message)  # noqa: E731
    with (
        FailStatements(engine, "UPDATE test_counters", times=10**6, error=error) as failing,
        pytest.raises(sqlqueue.DatabaseError),
    ):
        in_write(engine, dialect, lambda conn: _bump(conn, 7))
    assert failing.failed == 1


@pytest.mark.parametrize(
    ("code", "message"),
    [
        (2003, "Can't connect to MySQL server on '127.0.0.1'"),
        (2006, "MySQL server has gone away"),
        (2013, "Lost connection to MySQL server during query"),
    ],
)
def test_server_unreachable_codes_become_database_unavailable(engine, code, message):
    dialect = dialect_for(engine)
    error = lambda: pymysql.err.OperationalError(code, message)  # noqa: E731
    with (
        FailStatements(engine, "UPDATE test_counters", error=error),
        pytest.raises(sqlqueue.DatabaseUnavailable, match="cannot reach MariaDB/MySQL"),
    ):
        in_write(engine, dialect, lambda conn: _bump(conn, 7))


def test_a_server_that_cannot_be_reached_is_database_unavailable(mysql_url):
    # Port 1 on loopback: nothing listens there, the connection is refused (2003).
    url = sa.make_url(mysql_url).set(port=1)
    queue = sqlqueue.Queue(sa.create_engine(url, connect_args={"connect_timeout": 2}))
    with pytest.raises(sqlqueue.DatabaseUnavailable, match="cannot reach MariaDB/MySQL") as raised:
        queue.get_job(1)
    assert "2003" in str(raised.value)
