"""Watching what an in-process worker asks the database: the claim rounds it runs, counted
from the statements its engine sends (SQLAlchemy's ``after_cursor_execute`` event), and every
statement and commit (:func:`statements`). A test waits for rounds, an event the worker causes,
rather than sleeping and hoping one happened.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

__all__ = ["Sent", "claim_rounds", "is_claim", "statements"]


def is_claim(sql: str) -> bool:
    """Whether ``sql`` is a claim: the one UPDATE that counts an attempt (``attempts + 1``), on
    every backend (a CTE's UPDATE on PostgreSQL, UPDATE by id on MariaDB)."""
    return "UPDATE" in sql and "attempts + " in sql


@contextmanager
def claim_rounds(engine: sa.Engine) -> Iterator[Callable[[], int]]:
    """Count the claim statements ``engine`` (and the engines derived from it) sends while the
    block runs; yields a function returning the count so far."""
    lock = threading.Lock()
    seen = [0]

    def record(
        conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool
    ) -> None:
        if is_claim(statement):
            with lock:
                seen[0] += 1

    def count() -> int:
        with lock:
            return seen[0]

    sa.event.listen(engine, "after_cursor_execute", record)
    try:
        yield count
    finally:
        sa.event.remove(engine, "after_cursor_execute", record)


@dataclass
class Sent:
    """What an engine sent while :func:`statements` watched: each statement's SQL, in order,
    and how many transactions it committed."""

    sql: list[str] = field(default_factory=list)
    commits: int = 0

    def touching(self, table: str) -> list[str]:
        """The statements that name ``table``."""
        return [sql for sql in self.sql if table in sql]


@contextmanager
def statements(engine: sa.Engine) -> Iterator[Sent]:
    """Record every statement ``engine`` sends, and every commit, while the block runs."""
    lock = threading.Lock()
    sent = Sent()

    def record(
        conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool
    ) -> None:
        with lock:
            sent.sql.append(statement)

    def committed(conn: Any) -> None:
        with lock:
            sent.commits += 1

    sa.event.listen(engine, "after_cursor_execute", record)
    sa.event.listen(engine, "commit", committed)
    try:
        yield sent
    finally:
        sa.event.remove(engine, "after_cursor_execute", record)
        sa.event.remove(engine, "commit", committed)
