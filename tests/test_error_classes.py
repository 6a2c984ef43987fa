"""The one place that sorts database errors: ``Dialect.translate_error``, tried on each backend
with errors the real database raises.

A worker retries what may pass (``DatabaseUnavailable``: an outage, a lock conflict) and never
retries for ever what cannot (``DatabaseRefused``: a value out of range or too long, a
constraint, a character the database cannot store); ``SchemaNotMigrated`` says what to run;
anything else (a mistake in SQL) stays a plain ``DatabaseError``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from sqlqueue import DatabaseError, DatabaseRefused, DatabaseUnavailable, SchemaNotMigrated
from sqlqueue.dialects import dialect_for
from tests.conftest import Backend

#: A port nothing listens on (loopback only).
CLOSED_PORT = 1


@pytest.fixture
def scratch(backend: Backend) -> Iterator[sa.Engine]:
    """``backend``'s engine with a table of the test's own (dropped afterwards)."""
    with backend.engine.begin() as conn:
        conn.exec_driver_sql(
            "CREATE TABLE test_values (id INTEGER PRIMARY KEY, n INTEGER NOT NULL, s VARCHAR(5))"
        )
    yield backend.engine
    with backend.engine.begin() as conn:
        conn.exec_driver_sql("DROP TABLE test_values")


def _translated(engine: sa.Engine, statement: str) -> Exception:
    """What ``statement`` raises on ``engine``, as sqlqueue translates it."""
    with pytest.raises(sa.exc.SQLAlchemyError) as raised, engine.begin() as conn:
        conn.exec_driver_sql(statement)
    translated = dialect_for(engine).translate_error(raised.value)
    assert translated is not None, raised.value
    return translated


REFUSED = {
    "a NULL in a NOT NULL column": ("all", "INSERT INTO test_values (id, n) VALUES (1, NULL)"),
    "a duplicate primary key": ("all", "INSERT INTO test_values (id, n) VALUES (2, 1), (2, 1)"),
    "a string too long": ("servers", "INSERT INTO test_values (id, n, s) VALUES (3, 1, 'abcdefg')"),
    "an integer out of range": ("servers", "INSERT INTO test_values (id, n) VALUES (4, 1e12)"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_statement_refused_for_its_values_is_database_refused(
    backend: Backend, scratch: sa.Engine, case: str
) -> None:
    where, statement = REFUSED[case]
    if where == "servers" and backend.name == "sqlite":
        pytest.skip("SQLite stores any value in any column")
    error = _translated(scratch, statement)
    assert isinstance(error, DatabaseRefused), (type(error), str(error))
    assert not isinstance(error, DatabaseUnavailable)


def test_a_value_the_database_cannot_store_is_database_refused(
    backend: Backend, scratch: sa.Engine
) -> None:
    """PostgreSQL refuses NUL in text (psycopg files it under OperationalError, with the
    outages: it used to be retried as one); MariaDB a datetime past the year 9999 (PyMySQL
    files it under OperationalError too)."""
    if backend.name == "sqlite":
        pytest.skip("SQLite stores NUL and any text in a column")
    if backend.name == "postgresql":
        statement = "INSERT INTO test_values (id, n, s) VALUES (5, 1, chr(0))"
    else:
        with scratch.begin() as conn:
            conn.exec_driver_sql("ALTER TABLE test_values ADD COLUMN t DATETIME NULL")
        statement = "INSERT INTO test_values (id, n, t) VALUES (6, 1, '99999-01-01 00:00:00')"
    error = _translated(scratch, statement)
    assert isinstance(error, DatabaseRefused), (type(error), str(error))


def test_a_refusal_names_the_driver_error_and_its_first_line_only(
    backend: Backend, scratch: sa.Engine
) -> None:
    """PostgreSQL's next lines (``DETAIL: Failing row contains (…)``) quote the row's values,
    a payload's among them: they stay out of what a worker logs and stores."""
    with scratch.begin() as conn:
        conn.exec_driver_sql("INSERT INTO test_values (id, n, s) VALUES (7, 1, 'hush')")
    error = _translated(scratch, "INSERT INTO test_values (id, n, s) VALUES (7, 2, 'hush')")
    assert isinstance(error, DatabaseRefused)
    assert "\n" not in str(error)
    assert "hush" not in str(error)


def _unreachable(backend: Backend, tmp_path: Path) -> sa.Engine:
    if backend.name == "sqlite":
        return sa.create_engine(f"sqlite:///{tmp_path / 'no such directory' / 'jobs.db'}")
    return sa.create_engine(backend.engine.url.set(host="127.0.0.1", port=CLOSED_PORT))


def test_a_database_that_cannot_be_reached_is_database_unavailable(
    backend: Backend, tmp_path: Path
) -> None:
    engine = _unreachable(backend, tmp_path)
    try:
        error = _translated(engine, "SELECT 1")
    finally:
        engine.dispose()
    assert isinstance(error, DatabaseUnavailable), (type(error), str(error))


def test_a_missing_table_is_schema_not_migrated(backend: Backend) -> None:
    with backend.engine.begin() as conn:
        conn.exec_driver_sql("DROP TABLE sqlqueue_job_actions")
    error = _translated(backend.engine, "SELECT * FROM sqlqueue_job_actions")
    assert isinstance(error, SchemaNotMigrated)
    assert "sqlqueue migrate" in str(error)


def test_a_mistake_in_sql_is_neither_refused_nor_unavailable(backend: Backend) -> None:
    error = _translated(backend.engine, "SELEC 1")
    assert type(error) is DatabaseError, type(error)


def test_an_error_that_is_not_the_databases_is_left_alone(backend: Backend) -> None:
    assert dialect_for(backend.engine).translate_error(ValueError("a handler's")) is None
