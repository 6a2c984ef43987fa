"""The database fails mid-run: a chosen statement raises a real driver error (SQLAlchemy's
``before_cursor_execute`` event on the real engine, see tests/apps/statement_faults.py), and
each test says what the user sees — the worker's outcome writes, claims, releases and breaker
writes, and the errors sqlqueue raises.

A passing fault is retried within tens of milliseconds (sqlqueue/_worker/retries.py): the tests
check the delays the worker logs ("retrying in X s"), never the wall clock.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
from collections import Counter

import pytest
import sqlalchemy as sa

import sqlqueue
from sqlqueue._store.transactions import in_write, translated
from sqlqueue._worker import loop, slots
from sqlqueue._worker.retries import (
    OUTAGE_AFTER_SECONDS,
    OUTAGE_CAP_SECONDS,
    QUICK_CAP_SECONDS,
    Answers,
    Backoff,
)
from sqlqueue.dialects import dialect_for
from tests._support import WorkerThread, db_now, drain, wait_until
from tests.apps.statement_faults import FailStatements

#: The statements of each step, as every backend spells them.
COMPLETE = r"UPDATE sqlqueue_jobs SET status=\S+, started_at=coalesce\(.*?\), finished_at="
CLAIM = r"UPDATE sqlqueue_jobs SET status=\S+, attempts=\(sqlqueue_jobs\.attempts \+"
RELEASE = r"UPDATE sqlqueue_jobs SET status=\S+, attempts=\(sqlqueue_jobs\.attempts -"
BREAKER_FAILURE = r"INSERT INTO sqlqueue_circuit_breakers"

_DELAY = re.compile(r"retrying in ([0-9.]+) s")


def retry_delays(caplog: pytest.LogCaptureFixture) -> list[float]:
    """The waits the worker announced before its retries."""
    return [
        float(found.group(1))
        for record in caplog.records
        if record.name == "sqlqueue.worker" and (found := _DELAY.search(record.getMessage()))
    ]


def test_an_outcome_write_that_fails_is_written_on_the_retry_and_the_leases_are_kept(
    backend, caplog
):
    # Eight failures in a row take ~2.5 s of retries, longer than the 1.5 s lease: the jobs
    # stay ours meanwhile only because the heartbeat keeps extending their leases.
    queue = backend.queue(lease_seconds=1.5)
    runs: Counter[int] = Counter()

    @queue.task("t")
    def t(n: int) -> int:
        runs[n] += 1
        return n

    with backend.engine.begin() as conn:
        ids = t.enqueue_many(conn, [{"n": n} for n in range(6)])
    caplog.set_level(logging.INFO, logger="sqlqueue")
    with FailStatements(backend.engine, COMPLETE, times=8) as failing:
        drain(queue, concurrency=6)
    assert failing.failed == 8
    rows = [queue.get_job(job_id) for job_id in ids]
    assert [(job.status, job.attempts, job.errors, job.result) for job in rows] == [
        ("succeeded", 1, (), n) for n in range(6)
    ]
    assert runs == dict.fromkeys(range(6), 1)  # each ran once: no lease was lost and reaped
    delays = retry_delays(caplog)
    assert len(delays) == 8
    assert max(delays) <= QUICK_CAP_SECONDS * 1.2  # the cap and its jitter: never seconds more
    assert min(delays) < 0.05  # the first retry comes within tens of milliseconds


def test_a_claim_round_that_fails_in_a_burst_run_is_logged_retried_and_the_worker_drains(
    backend, caplog
):
    queue = backend.queue()
    runs: Counter[int] = Counter()

    @queue.task("t")
    def t(n: int) -> None:
        runs[n] += 1

    with backend.engine.begin() as conn:
        ids = t.enqueue_many(conn, [{"n": n} for n in range(20)])
    caplog.set_level(logging.INFO, logger="sqlqueue")
    with FailStatements(backend.engine, CLAIM, nth=2) as failing:
        drain(queue, concurrency=2)  # returns: the burst worker exits once drained
    assert failing.failed == 1
    said = [r for r in caplog.records if r.getMessage().startswith("cannot claim jobs:")]
    assert len(said) == 1
    assert said[0].levelno == logging.ERROR
    assert retry_delays(caplog)[0] < 0.05
    assert {queue.get_job(job_id).status for job_id in ids} == {"succeeded"}
    assert runs == dict.fromkeys(range(20), 1)


def test_a_burst_worker_whose_claims_keep_failing_stops_with_the_error(
    backend, caplog, monkeypatch
):
    monkeypatch.setattr(loop, "BURST_PATIENCE_SECONDS", 1.0)
    queue = backend.queue()

    @queue.task("t")
    def t() -> None:
        pass

    with backend.engine.begin() as conn:
        job_id = t.enqueue(conn)
    caplog.set_level(logging.INFO, logger="sqlqueue")
    with (
        FailStatements(backend.engine, CLAIM, times=10**6),
        pytest.raises(sqlqueue.DatabaseUnavailable),
    ):
        drain(queue)
    assert any("a burst worker stops" in r.getMessage() for r in caplog.records)
    assert max(retry_delays(caplog)) <= QUICK_CAP_SECONDS * 1.2
    assert queue.get_job(job_id).status == "queued"  # never claimed: nothing to recover


def job_of(queue: sqlqueue.Queue, job_id: int) -> sqlqueue.Job:
    """The job, which must exist."""
    job = queue.get_job(job_id)
    assert job is not None
    return job


def _endless_job(
    backend, lease_seconds: float = 1.0
) -> tuple[sqlqueue.Queue, int, threading.Event]:
    queue = backend.queue(lease_seconds=lease_seconds)
    started = threading.Event()

    @queue.task("endless")
    async def endless(first: bool = True) -> None:
        started.set()
        await asyncio.sleep(3600)

    with backend.engine.begin() as conn:
        job_id = endless.enqueue(conn)
    return queue, job_id, started


def test_a_release_at_shutdown_that_fails_once_is_retried_without_burning_an_attempt(
    backend, caplog
):
    # A lease far longer than the shutdown: the retried release, not the reaper, returns it.
    queue, job_id, started = _endless_job(backend, lease_seconds=10.0)
    caplog.set_level(logging.INFO, logger="sqlqueue")
    worker = queue.worker(concurrency=1, poll_interval=0.05, shutdown_timeout=0.2)
    with WorkerThread(worker) as running:
        assert started.wait(10)
        with FailStatements(backend.engine, RELEASE) as failing:
            running.stop()
    assert failing.failed == 1
    job = job_of(queue, job_id)
    assert (job.status, job.attempts, job.locked_by) == ("queued", 0, None)
    assert retry_delays(caplog)[-1] < 0.05


def test_jobs_whose_release_at_shutdown_never_lands_are_not_lost_the_reaper_returns_them(
    backend, caplog
):
    queue, job_id, started = _endless_job(backend)
    caplog.set_level(logging.INFO, logger="sqlqueue")
    worker = queue.worker(concurrency=1, poll_interval=0.05, shutdown_timeout=0.2)
    with WorkerThread(worker) as running:
        assert started.wait(10)
        with FailStatements(backend.engine, RELEASE, times=10**6):
            running.stop()
    assert any("their leases will expire" in r.getMessage() for r in caplog.records)
    assert job_of(queue, job_id).status == "running"  # still leased by the stopped worker
    wait_until(lambda: job_id in queue.store.reap_expired()[0], timeout=10)  # lease of 1 s
    job = job_of(queue, job_id)
    # Back in the queue, due at once; the reaper counts the attempt as a crashed worker's.
    assert (job.status, job.attempts) == ("failed", 1)
    assert job.errors[-1].kind == "LeaseExpired"
    assert job.next_run_at <= db_now(backend.engine)


def test_held_jobs_whose_release_at_shutdown_never_lands_come_back_with_no_attempt_used(
    backend, caplog, monkeypatch
):
    # Every pool claims ahead once a job has run, and never gives held jobs back on its own:
    # "blocker" takes the one slot and "held" waits, claimed ahead, until the worker stops.
    monkeypatch.setattr(slots, "QUICK_SECONDS", 3600.0)
    monkeypatch.setattr(slots, "HOLD_SECONDS", 3600.0)
    queue = backend.queue(lease_seconds=1.0)
    runs: Counter[str] = Counter()
    blocking = threading.Event()

    @queue.task("t")
    async def t(name: str) -> None:
        runs[name] += 1
        if name == "blocker" and runs[name] == 1:
            blocking.set()
            await asyncio.sleep(3600)

    with backend.engine.begin() as conn:
        first, blocker, held = t.enqueue_many(
            conn, [{"name": "first"}, {"name": "blocker"}, {"name": "held"}]
        )
    caplog.set_level(logging.INFO, logger="sqlqueue")
    worker = queue.worker(concurrency=1, poll_interval=0.05, shutdown_timeout=0.2)
    with WorkerThread(worker) as running:
        assert blocking.wait(10)
        wait_until(lambda: job_of(queue, held).status == "running")
        assert job_of(queue, held).started_at is None  # leased, held for the slot: not started
        with FailStatements(backend.engine, RELEASE, times=10**6) as failing:
            running.stop()
    assert failing.failed >= 2  # the held job's release, then the blocker's: every try failed
    assert runs["held"] == 0
    assert job_of(queue, held).status == "running"  # still leased by the stopped worker
    wait_until(lambda: held in queue.store.reap_expired()[0], timeout=10)  # lease of 1 s
    job = job_of(queue, held)
    assert (job.status, job.attempts, job.locked_by) == ("queued", 0, None)
    assert [error.kind for error in job.errors] == ["NotStarted"]  # why it waited, not counted
    assert job.next_run_at <= db_now(backend.engine)
    # The blocker ran: the reaper counts its attempt, as for a worker that crashed mid-job.
    wait_until(
        lambda: (
            blocker in queue.store.reap_expired()[0] or job_of(queue, blocker).status == "failed"
        )
    )
    assert job_of(queue, blocker).attempts == 1
    drain(queue, concurrency=1)
    assert runs == {"first": 1, "blocker": 2, "held": 1}
    job = job_of(queue, held)
    assert (job.status, job.attempts) == ("succeeded", 1)
    assert job.started_at is not None
    assert job_of(queue, first).status == "succeeded"


def test_a_held_job_whose_give_back_never_lands_comes_back_with_no_attempt_used(
    backend, caplog, monkeypatch
):
    # The pool claims ahead ("first" is quick), then "blocker" keeps its only slot: after
    # HOLD_SECONDS the worker gives "held" back, and every try of that release fails. The
    # reaper (the worker's own) returns it unused once its lease expires; another worker runs
    # it once.
    monkeypatch.setattr(slots, "QUICK_SECONDS", 1.0)
    monkeypatch.setattr(slots, "HOLD_SECONDS", 1.2)
    queue = backend.queue(lease_seconds=2.0)
    runs: Counter[str] = Counter()
    release = threading.Event()

    @queue.task("t")
    async def t(name: str) -> None:
        runs[name] += 1
        if name == "blocker" and runs[name] == 1:  # a rerun (its lease lost) blocks nobody
            await asyncio.to_thread(release.wait, 30)

    with backend.engine.begin() as conn:
        _, _, held = t.enqueue_many(
            conn, [{"name": "first"}, {"name": "blocker"}, {"name": "held"}]
        )
    caplog.set_level(logging.INFO, logger="sqlqueue")
    # The worker's release only: the reaper's give-back of an unstarted job writes errors too.
    release_only = RELEASE + r"(?!.*errors=)"
    busy = queue.worker(concurrency=1, poll_interval=0.05, reaper_interval=0.2)
    with WorkerThread(busy), FailStatements(backend.engine, release_only, times=10**6) as failing:
        wait_until(lambda: failing.failed >= 1)  # the give-back was tried, and failed
        wait_until(lambda: any(e.kind == "NotStarted" for e in job_of(queue, held).errors))
        assert runs["held"] == 0
        with WorkerThread(queue.worker(concurrency=1, poll_interval=0.05)):
            wait_until(lambda: job_of(queue, held).status == "succeeded", timeout=20)
        release.set()
    job = job_of(queue, held)
    assert (job.attempts, runs["held"]) == (1, 1)
    assert [e.kind for e in job.errors] == ["NotStarted"]


def test_a_failed_circuit_breaker_write_still_records_the_attempts_outcome(backend, caplog):
    queue = backend.queue()
    breaker = sqlqueue.CircuitBreaker(failure_threshold=5, cooldown_seconds=60)

    @queue.task("flaky", circuit_breaker=breaker, max_attempts=3)
    def flaky() -> None:
        raise ConnectionError("the partner API is down")

    with backend.engine.begin() as conn:
        job_id = flaky.enqueue(conn)
    caplog.set_level(logging.INFO, logger="sqlqueue")
    # Every try of the breaker's write fails: the worker gives up on it, not on the outcome.
    with FailStatements(backend.engine, BREAKER_FAILURE, times=3) as failing:
        drain(queue, concurrency=1)  # one attempt: the retry is due later than the drain ends
    assert failing.failed == 3
    job = queue.get_job(job_id)
    assert (job.status, job.attempts) == ("failed", 1)
    assert "the partner API is down" in (job.last_error or "")
    assert any("could not record job" in r.getMessage() for r in caplog.records)
    assert queue.store.read_breaker("flaky") is None  # the breaker never heard of it


def test_a_circuit_breaker_write_that_fails_once_lands_on_the_retry(backend):
    queue = backend.queue()
    breaker = sqlqueue.CircuitBreaker(failure_threshold=1, cooldown_seconds=60)

    @queue.task("flaky", circuit_breaker=breaker, max_attempts=3)
    def flaky() -> None:
        raise ConnectionError("the partner API is down")

    with backend.engine.begin() as conn:
        job_id = flaky.enqueue(conn)
    with FailStatements(backend.engine, BREAKER_FAILURE) as failing:
        drain(queue, concurrency=1)
    assert failing.failed == 1
    assert queue.get_job(job_id).attempts == 1
    stored = queue.store.read_breaker("flaky")
    assert stored is not None
    assert stored.state == "open"


# -- what the errors become --------------------------------------------------------------------


def _a_statement(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(conn.exec_driver_sql("SELECT 41").scalar_one())


def test_an_error_that_is_not_the_databases_passes_through_unchanged(backend):
    dialect = dialect_for(backend.engine)

    class Mine(Exception):
        pass

    mine = Mine("raised by the app's own listener")
    with FailStatements(backend.engine, "SELECT 41", times=2, error=lambda: mine):
        with pytest.raises(Mine) as raised:
            translated(dialect, lambda: _a_statement(backend.engine))
        assert raised.value is mine
        with pytest.raises(Mine) as raised:
            in_write(backend.engine, dialect, lambda conn: conn.exec_driver_sql("SELECT 41"))
        assert raised.value is mine


def test_a_dropped_connection_becomes_database_unavailable(backend):
    dialect = dialect_for(backend.engine)
    with (
        FailStatements(backend.engine, "SELECT 41", error=lambda: _disconnect(backend.name)),
        pytest.raises(sqlqueue.DatabaseUnavailable, match=r"cannot reach|cannot open|lost|closed"),
    ):
        translated(dialect, lambda: _a_statement(backend.engine))
    assert _a_statement(backend.engine) == 41  # the pool replaced the dropped connection


def _disconnect(name: str) -> Exception:
    if name == "postgresql":
        import psycopg

        return psycopg.OperationalError("server closed the connection unexpectedly")
    if name == "mysql":
        import pymysql  # type: ignore[import-untyped]

        lost: Exception = pymysql.err.OperationalError(2013, "Lost connection to MySQL server")
        return lost
    import sqlite3

    return sqlite3.OperationalError("unable to open database file")


def test_a_pool_timeout_becomes_database_unavailable(backend):
    engine = sa.create_engine(
        backend.url, pool_size=1, max_overflow=0, pool_timeout=0.1, poolclass=sa.pool.QueuePool
    )
    queue = sqlqueue.Queue(engine)
    try:
        with engine.connect() as held:  # the pool's only connection
            held.exec_driver_sql("SELECT 1")
            with pytest.raises(sqlqueue.DatabaseUnavailable, match="connection"):
                queue.get_job(1)
    finally:
        engine.dispose()


def test_a_non_transient_database_error_is_a_database_error_not_unavailable(backend):
    dialect = dialect_for(backend.engine)
    with pytest.raises(sqlqueue.DatabaseError) as raised:
        translated(
            dialect,
            lambda: in_write(
                backend.engine,
                dialect,
                lambda conn: conn.exec_driver_sql("SELECT no_such_column FROM sqlqueue_jobs"),
            ),
        )
    assert not isinstance(raised.value, sqlqueue.DatabaseUnavailable)


# -- the waits themselves ------------------------------------------------------------------------


def test_retries_start_within_tens_of_ms_cap_while_the_database_answers_and_grow_in_an_outage():
    now = [0.0]
    answers = Answers(clock=lambda: now[0])
    backoff = Backoff(answers)
    waits = [backoff.failed() for _ in range(12)]
    assert 0.016 <= waits[0] <= 0.024  # 20 ms ± the jitter
    assert all(wait <= QUICK_CAP_SECONDS * 1.2 for wait in waits)
    assert waits[-1] >= QUICK_CAP_SECONDS * 0.8  # reached the cap, never past it
    backoff.succeeded()
    assert backoff.failed() <= 0.024  # its own success starts it over
    now[0] = OUTAGE_AFTER_SECONDS * 3.5  # nothing answered for 35 s: an outage
    outage = [backoff.failed() for _ in range(12)]
    assert QUICK_CAP_SECONDS * 1.2 < max(outage) <= OUTAGE_CAP_SECONDS * 1.2
    answers.answered()  # another call got through: the quick cap again
    assert backoff.failed() <= QUICK_CAP_SECONDS * 1.2
