"""Where a job that may have finished is read: ``sqlqueue_jobs``, and on a backend that moves
succeeded jobs into the partitioned history (``Dialect.supports_history_partitions``) that
table too, as one selectable with the same columns.

A read is written once against ``jobs``, as everywhere else, and :func:`readable` points it at
both tables; writes and claims never go through here (they act on the hot table only, and a
moved job is one nothing acts on any more: see :mod:`sqlqueue._store.history`).
"""

from __future__ import annotations

from typing import Any, TypeVar

from sqlalchemy import Connection, select, union_all
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.util import ClauseAdapter

from sqlqueue._schema import jobs, jobs_history
from sqlqueue.dialects import Dialect

__all__ = ["moved_row", "readable", "readable_jobs"]

_Clause = TypeVar("_Clause", bound=ClauseElement)

#: The two tables as one, named as the jobs table is (so a statement reads the same).
_BOTH = union_all(select(jobs), select(*jobs_history.c)).subquery(jobs.name)


def readable_jobs(dialect: Dialect) -> Any:
    """Every job that can be read: the jobs table, plus the history where the backend has it."""
    return _BOTH if dialect.supports_history_partitions else jobs


def readable(statement: _Clause, dialect: Dialect) -> _Clause:
    """``statement``, written against ``jobs``, made to read :func:`readable_jobs` instead
    (each column of ``jobs`` replaced by the union's; other tables untouched)."""
    if not dialect.supports_history_partitions:
        return statement
    adapted: _Clause = ClauseAdapter(_BOTH).traverse(statement)
    return adapted


def moved_row(conn: Connection, dialect: Dialect, job_id: int) -> Any:
    """Job ``job_id``'s row in the history, or ``None`` (and always ``None`` where there is
    none): an action on a job the hot table lacks says what the job is, not that it is gone."""
    if not dialect.supports_history_partitions:
        return None
    query = select(jobs_history).where(jobs_history.c.id == job_id)
    return conn.execute(query).mappings().first()
