"""The overview's most frequent errors on a big history (migration 0014): the same answer on
every backend — unhandled failures only, grouped by their first 200 characters — and, on
SQLite, read from ``ix_sqlqueue_jobs_unhandled_errors`` alone (the plan says so), so the
overview does not read every dead job's row (``python -m bench.web`` times it)."""

from __future__ import annotations

import pytest

import sqlqueue
from tests._support import drain, enqueue
from tests._support.statements import statements
from tests.conftest import Backend


def _queue(backend: Backend) -> sqlqueue.Queue:
    queue = backend.queue()

    @queue.task("boom", max_attempts=1)
    def boom(n: int, error: str) -> None:
        raise ConnectionError(error)

    return queue


def test_top_errors_count_unhandled_failures_by_their_first_200_characters(
    backend: Backend,
) -> None:
    queue = _queue(backend)
    long_a, long_b = "x" * 250 + "a", "x" * 250 + "b"  # the same first 200 characters
    enqueue(queue, "boom", 2, error=long_a)
    enqueue(queue, "boom", 1, error=long_b)
    enqueue(queue, "boom", 2, error="503 from crm")
    requeued, discarded = enqueue(queue, "boom", 2, error="410 Gone")
    drain(queue)
    queue.requeue(requeued, by="ada", reason="fixed")
    queue.discard(discarded, by="ada", reason="spam")
    drain(queue)  # the requeued copy dies again: unhandled, counted once

    top = [(error.error, error.count) for error in queue.stats().top_errors]

    assert top == [
        ("ConnectionError: " + "x" * (200 - len("ConnectionError: ")), 3),
        ("ConnectionError: 503 from crm", 2),
        ("ConnectionError: 410 Gone", 1),
    ]


def test_sqlite_reads_the_top_errors_from_their_index_alone(backend: Backend) -> None:
    if backend.name != "sqlite":
        pytest.skip("the index is SQLite's: PostgreSQL would visit every row anyway")
    queue = _queue(backend)
    enqueue(queue, "boom", 3, error="503 from crm")
    drain(queue)
    with statements(backend.engine) as sent:
        assert queue.stats().top_errors[0].count == 3
    (query,) = [sql for sql in sent.sql if "GROUP BY substr(" in sql]
    with backend.engine.connect() as conn:
        # INDEXED BY fails ("no query solution") unless the index can answer the query; which
        # index the planner picks on its own depends on the table's size and statistics
        # (on a million rows, this one: see bench/web.py).
        forced = query.replace(
            "FROM sqlqueue_jobs", "FROM sqlqueue_jobs INDEXED BY ix_sqlqueue_jobs_unhandled_errors"
        )
        explained = conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {forced}", (10, 0))  # LIMIT, OFFSET
        plan = " ".join(str(row[3]) for row in explained)
        rows = conn.exec_driver_sql(forced, (10, 0)).all()
    assert "USING INDEX ix_sqlqueue_jobs_unhandled_errors" in plan, plan
    assert "TEMP B-TREE FOR GROUP BY" not in plan  # grouped in the index's order
    assert rows == [("ConnectionError: 503 from crm", 3)]
    # No bound parameter before the LIMIT: SQLite matches the index word for word.
    assert "?" not in query.split("LIMIT")[0]
