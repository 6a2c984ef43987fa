"""A database that refuses some jobs' outcomes for their values, as a real one refuses a value
out of range: a CHECK constraint (MariaDB) or a trigger that raises a constraint error
(PostgreSQL, SQLite) on any write of a job row whose error or result holds :data:`MARK`.

It stands for the refusals no check in sqlqueue foresaw: the worker must record a substitute
outcome and go on, never retry the refused write for ever.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa

__all__ = ["MARK", "refusing_outcomes"]

#: What makes the database refuse a job row's write when its error or result holds it.
MARK = "refuse-me"

_CONDITION = f"NEW.last_error LIKE '%{MARK}%' OR CAST(NEW.result AS {{text}}) LIKE '%{MARK}%'"

_CREATE = {
    "postgresql": [
        "CREATE FUNCTION test_refuse_outcome() RETURNS trigger LANGUAGE plpgsql AS $$ "
        "BEGIN RAISE EXCEPTION 'refused by the database' USING ERRCODE = 'check_violation'; "
        "END $$",
        "CREATE TRIGGER test_refuse_outcome BEFORE UPDATE ON sqlqueue_jobs FOR EACH ROW "
        f"WHEN ({_CONDITION.format(text='text')}) EXECUTE FUNCTION test_refuse_outcome()",
    ],
    "sqlite": [
        "CREATE TRIGGER test_refuse_outcome BEFORE UPDATE ON sqlqueue_jobs FOR EACH ROW "
        f"WHEN {_CONDITION.format(text='TEXT')} "
        "BEGIN SELECT RAISE(ABORT, 'refused by the database'); END",
    ],
    "mysql": [
        "ALTER TABLE sqlqueue_jobs ADD CONSTRAINT test_refuse_outcome CHECK ("
        f"COALESCE(last_error, '') NOT LIKE '%{MARK}%' "
        f"AND COALESCE(result, '') NOT LIKE '%{MARK}%')",
    ],
}

_DROP = {
    "postgresql": [
        "DROP TRIGGER IF EXISTS test_refuse_outcome ON sqlqueue_jobs",
        "DROP FUNCTION IF EXISTS test_refuse_outcome()",
    ],
    "sqlite": ["DROP TRIGGER IF EXISTS test_refuse_outcome"],
    "mysql": ["ALTER TABLE sqlqueue_jobs DROP CONSTRAINT IF EXISTS test_refuse_outcome"],
}


@contextmanager
def refusing_outcomes(engine: sa.Engine) -> Iterator[None]:
    """While the block runs, ``engine``'s database refuses job rows holding :data:`MARK`."""
    name = engine.dialect.name
    with engine.begin() as conn:
        for statement in _CREATE[name]:  # the server drivers read % as a placeholder
            conn.exec_driver_sql(statement if name == "sqlite" else statement.replace("%", "%%"))
    try:
        yield
    finally:
        with engine.begin() as conn:
            for statement in _DROP[name]:
                conn.exec_driver_sql(statement)
