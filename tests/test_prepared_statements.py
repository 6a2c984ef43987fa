"""PostgreSQL: sqlqueue's reads leave psycopg's prepared statements in place.

psycopg forgets every server-side prepared statement of a connection at each ROLLBACK it sends,
and a pooled connection that goes back with its transaction open is rolled back. A worker
reads its queues' pauses every poll interval on the connection its claims and completions
use; when those reads rolled back, PostgreSQL parsed and planned the claim and the completion
again every few rounds. Reads end with a COMMIT instead (``transactions.in_read``).
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa

import sqlqueue
from sqlqueue._store.gates import RateCheck
from tests._support.jobs import drain, enqueue

#: psycopg prepares a statement on its sixth execution (``prepare_threshold`` is 5).
_PREPARED_AFTER = 6


def _prepared(engine: sa.Engine) -> dict[str, int]:
    """The statements prepared on the connections ``engine``'s pool holds, each with how
    many times it has run since it was prepared (PostgreSQL counts its plans), summed over
    the connections: the pool hands its connections out in turn, so a statement that two
    of them prepared ran on each in part."""
    held = [engine.connect() for _ in range(engine.pool.checkedin())]  # type: ignore[attr-defined]
    try:
        found: dict[str, int] = {}
        for conn in held:
            rows = conn.exec_driver_sql(
                "SELECT statement, generic_plans + custom_plans FROM pg_prepared_statements"
            )
            for statement, runs in rows:
                text = " ".join(str(statement).split())
                found[text] = found.get(text, 0) + int(runs)
            conn.commit()
        return found
    finally:
        for conn in held:
            conn.close()


@pytest.fixture
def one_connection(backend):
    """An engine of one pooled connection on ``backend`` (PostgreSQL only)."""
    if backend.name != "postgresql":
        pytest.skip("psycopg's prepared statements: PostgreSQL only")
    engine = sa.create_engine(backend.url, pool_size=1, max_overflow=0)
    try:
        yield engine
    finally:
        engine.dispose()


def test_a_read_keeps_the_statements_prepared_before_it(one_connection):
    queue = sqlqueue.Queue(one_connection)
    with one_connection.begin() as conn:
        job_id = queue.enqueue(conn, "t", {"n": 1}, external=True)
    for _ in range(_PREPARED_AFTER):
        assert queue.get_job(job_id) is not None
    # Each read went back to the pool in between: the statement is still prepared, having run
    # as a prepared statement once (before, every read's rollback forgot it).
    reads = [
        runs
        for statement, runs in _prepared(one_connection).items()
        if "FROM sqlqueue_jobs" in statement
    ]
    assert reads == [1]
    queue.stats()  # a snapshot read, ended the same way
    assert queue.get_job(job_id) is not None
    reads = [
        runs
        for statement, runs in _prepared(one_connection).items()
        if "FROM sqlqueue_jobs" in statement and "WHERE sqlqueue_jobs.id" in statement
    ]
    assert reads == [2], "the prepared read survived the stats snapshot and ran again"


def _runs_of_get_job(engine: sa.Engine) -> list[int]:
    return [
        runs
        for statement, runs in _prepared(engine).items()
        if "FROM sqlqueue_jobs" in statement and "WHERE sqlqueue_jobs.id" in statement
    ]


def test_a_rate_limit_that_refuses_keeps_the_statements_prepared_before_it(one_connection):
    queue = sqlqueue.Queue(one_connection)
    with one_connection.begin() as conn:
        job_id = queue.enqueue(conn, "t", {"n": 1}, external=True)
    for _ in range(_PREPARED_AFTER):
        queue.get_job(job_id)
    limit = RateCheck(key="provider", per_second=0.001, capacity=1.0)
    assert queue.store.pass_gates(fence=(job_id, 1), breaker=None, rate=limit).allowed
    refused = queue.store.pass_gates(fence=(job_id, 1), breaker=None, rate=limit)
    assert refused.refused_by == "rate_limit"
    assert _runs_of_get_job(one_connection) == [1], "a refusal wrote nothing to roll back"


def test_a_worker_claims_with_one_prepared_statement_through_its_pause_reads(backend):
    if backend.name != "postgresql":
        pytest.skip("psycopg's prepared statements: PostgreSQL only")
    queue = backend.queue()
    queue.task("t")(lambda n: None)
    enqueue(queue, "t", 300)
    # One job at a time: 300 rounds, with the queues' pauses read every 5 ms beside them.
    drain(queue, concurrency=1, poll_interval=0.005)
    claims = [
        runs
        for statement, runs in _prepared(backend.engine).items()
        if statement.startswith("WITH sqlqueue_due")
    ]
    # Prepared once on each connection that ran it, and run as a prepared statement for most
    # rounds since (before, a pause read every few rounds dropped it: it never ran more than a
    # handful of times as a prepared statement).
    assert claims, "the claim is prepared"
    assert sum(claims) > 150, claims
