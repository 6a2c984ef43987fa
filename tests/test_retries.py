"""Failed attempts retry with backoff, record what happened, and end dead; dead jobs requeue."""

from __future__ import annotations

import gc
import random

import pytest
import sqlalchemy as sa

import sqlqueue
from sqlqueue._policies.backoff import Exponential, Linear, Schedule
from tests._support import count_jobs, db_now, drain


def test_exponential_backoff_doubles_from_base_up_to_the_cap():
    backoff = sqlqueue.exponential(base=5, factor=2, cap=60, jitter=0)
    assert [backoff.delay(n) for n in range(1, 7)] == [5, 10, 20, 40, 60, 60]
    assert backoff.delay(10_000) == 60  # no overflow


def test_exponential_backoff_grows_by_its_factor():
    """A factor other than the default 2 is honoured by ``exponential`` and by the delay."""
    backoff = sqlqueue.exponential(base=1, factor=3, cap=100, jitter=0)
    assert [backoff.delay(n) for n in range(1, 7)] == [1, 3, 9, 27, 81, 100]
    assert [sqlqueue.exponential(base=2, factor=1.5, jitter=0).delay(n) for n in (1, 2, 3)] == [
        2,
        3,
        4.5,
    ]


def test_jitter_stays_within_its_fraction_and_varies():
    backoff = Exponential(base=100, factor=1, cap=100, jitter=0.1, rng=random.Random(7))
    delays = [backoff.delay(1) for _ in range(200)]
    assert all(90 <= d <= 110 for d in delays)
    assert len(set(delays)) > 100


def test_default_backoff_is_5_10_20_seconds_with_10_percent_jitter():
    backoff = sqlqueue.exponential()
    for attempt, centre in [(1, 5), (2, 10), (3, 20), (12, 3600)]:
        assert centre * 0.9 <= backoff.delay(attempt) <= centre * 1.1


def test_linear_and_explicit_schedules():
    assert [Linear(base=10, step=5, cap=22, jitter=0).delay(n) for n in (1, 2, 3, 4)] == [
        10,
        15,
        20,
        22,
    ]
    plan = sqlqueue.schedule([60, 300, 1800, 7200])
    assert isinstance(plan, Schedule)
    assert [plan.delay(n) for n in (1, 2, 3, 4, 5)] == [60, 300, 1800, 7200, 7200]


def _failing_queue(backend, **task_options):
    queue = backend.queue()
    calls: list[int] = []

    @queue.task("flaky", **task_options)
    def flaky(fail_times: int, error: str = "ValueError") -> None:
        calls.append(1)
        if len(calls) <= fail_times:
            raise {"ValueError": ValueError, "ConnectionError": ConnectionError}[error](
                f"failure {len(calls)}"
            )

    return queue, flaky, calls


def test_a_failure_schedules_a_retry_by_backoff_and_records_the_error(backend):
    queue, flaky, _ = _failing_queue(backend, backoff=sqlqueue.exponential(base=600, jitter=0))
    with backend.engine.begin() as conn:
        job_id = flaky.enqueue(conn, fail_times=1)
    drain(queue)
    job = queue.get_job(job_id)
    assert job.status == "failed"
    assert job.attempts == 1
    assert job.last_error == "ValueError: failure 1"
    assert job.finished_at is None
    [record] = job.errors
    assert (record.attempt, record.kind, record.error) == (1, "ValueError", "ValueError: failure 1")
    assert "raise" in record.details["traceback"]
    # The failure and its retry time are one statement: due 600 s after the row was written.
    assert (job.next_run_at - job.updated_at).total_seconds() == pytest.approx(600, abs=0.01)
    assert job.started_at <= record.at <= db_now(backend.engine)


def test_retries_until_success_and_keeps_the_history(backend):
    queue, flaky, calls = _failing_queue(backend, backoff=[0])
    with backend.engine.begin() as conn:
        job_id = flaky.enqueue(conn, fail_times=2)
    for _ in range(3):
        drain(queue)
    job = queue.get_job(job_id)
    assert job.status == "succeeded"
    assert job.attempts == 3
    assert [e.attempt for e in job.errors] == [1, 2]
    assert job.last_error == "ValueError: failure 2"  # what happened last time it failed
    assert job.finished_at is not None
    assert len(calls) == 3


def test_after_the_last_attempt_the_job_is_dead(backend):
    queue, flaky, calls = _failing_queue(backend, backoff=[0], max_attempts=3)
    with backend.engine.begin() as conn:
        job_id = flaky.enqueue(conn, fail_times=99)
    for _ in range(4):
        drain(queue)
    job = queue.get_job(job_id)
    assert (job.status, job.attempts, len(calls)) == ("dead", 3, 3)
    assert [e.attempt for e in job.errors] == [1, 2, 3]
    assert job.finished_at is not None


def test_retry_signal_sets_the_delay_and_counts_an_attempt(backend):
    queue = backend.queue()

    @queue.task("later", max_attempts=2)
    def later() -> None:
        raise sqlqueue.Retry(delay=120, reason="rate limited upstream")

    with backend.engine.begin() as conn:
        job_id = later.enqueue(conn)
    drain(queue)
    job = queue.get_job(job_id)
    assert (job.status, job.attempts) == ("failed", 1)
    assert job.last_error == "Retry: rate limited upstream"
    # The failure and its retry time are one statement: due 120 s after the row was written.
    assert (job.next_run_at - job.updated_at).total_seconds() == pytest.approx(120, abs=0.01)


def test_a_signal_s_details_land_in_the_attempt_s_error_history(backend):
    queue = backend.queue()

    @queue.task("call", max_attempts=3, backoff=[0])
    def call(ctx: sqlqueue.JobContext) -> None:
        if ctx.attempt == 1:
            raise sqlqueue.Retry(reason="503", details={"status": 503, "body": "busy\x00"})
        if ctx.attempt == 2:
            raise sqlqueue.Retry(reason="huge", details={"body": "x" * 100_000})
        raise sqlqueue.PermanentError("400", details={"status": 400, "when": object()})

    with backend.engine.begin() as conn:
        job_id = call.enqueue(conn)
    drain(queue)
    job = queue.get_job(job_id)
    assert (job.status, job.attempts) == ("dead", 3)
    first, huge, permanent = job.errors
    assert first.details is not None
    assert first.details["status"] == 503
    assert first.details["body"] == "busy\\x00"  # storable on PostgreSQL too
    assert "elapsed_seconds" in first.details
    assert huge.details is not None
    assert len(huge.details["details_truncated"]) == 8_000  # a bounded history entry
    # Details that are not JSON are noted, never a reason for the outcome to go unwritten.
    assert permanent.details is not None
    assert "details_unstorable" in permanent.details
    assert "traceback" in permanent.details


def test_retry_signal_on_the_last_attempt_means_dead(backend):
    queue = backend.queue()

    @queue.task("later", max_attempts=1)
    def later() -> None:
        raise sqlqueue.Retry(delay=1)

    with backend.engine.begin() as conn:
        job_id = later.enqueue(conn)
    drain(queue)
    assert (queue.get_job(job_id).status, queue.get_job(job_id).attempts) == ("dead", 1)


def test_permanent_error_goes_straight_to_dead(backend):
    queue = backend.queue()

    @queue.task("charge", max_attempts=8)
    def charge() -> None:
        raise sqlqueue.PermanentError("card declined: do not retry")

    with backend.engine.begin() as conn:
        job_id = charge.enqueue(conn)
    drain(queue)
    job = queue.get_job(job_id)
    assert (job.status, job.attempts) == ("dead", 1)
    assert job.last_error == "PermanentError: card declined: do not retry"


def test_retry_on_limits_which_errors_are_worth_retrying(backend):
    queue, flaky, _ = _failing_queue(backend, backoff=[3600], retry_on=ConnectionError)
    with backend.engine.begin() as conn:
        transient = flaky.enqueue(conn, fail_times=99, error="ConnectionError")
        fatal = flaky.enqueue(conn, fail_times=99, error="ValueError")
    drain(queue)
    assert queue.get_job(transient).status == "failed"
    assert queue.get_job(fatal).status == "dead"
    assert queue.get_job(fatal).attempts == 1


def test_requeue_makes_a_new_job_and_marks_the_dead_one(backend):
    queue = backend.queue()
    broken = {"on": True}

    @queue.task("sync_crm", max_attempts=1)
    def sync_crm(user_id: int) -> None:
        if broken["on"]:
            raise ConnectionError("CRM is down")

    with backend.engine.begin() as conn:
        dead_id = sync_crm.options(idempotency_key="crm:user:1", priority=3).enqueue(
            conn, user_id=1
        )
    drain(queue)
    assert queue.get_job(dead_id).status == "dead"

    broken["on"] = False
    new_id = queue.requeue(dead_id, by="alice", reason="CRM is back")
    assert new_id != dead_id
    dead = queue.get_job(dead_id)
    assert dead.status == "dead"
    assert (dead.requeued_as, dead.requeued_by, dead.requeue_reason) == (
        new_id,
        "alice",
        "CRM is back",
    )
    assert dead.requeued_at is not None
    assert dead.last_error == "ConnectionError: CRM is down"
    fresh = queue.get_job(new_id)
    assert (fresh.status, fresh.attempts, fresh.requeued_from) == ("queued", 0, dead_id)
    assert (fresh.job_type, fresh.payload, fresh.priority) == ("sync_crm", {"user_id": 1}, 3)
    # The idempotency key moved to the live job.
    assert fresh.idempotency_key == "crm:user:1"
    assert dead.idempotency_key is None
    with backend.engine.begin() as conn:
        assert sync_crm.options(idempotency_key="crm:user:1").enqueue(conn, user_id=1) == new_id
    drain(queue)
    assert queue.get_job(new_id).status == "succeeded"
    assert count_jobs(backend.engine) == 2


def test_requeue_refuses_what_is_not_a_single_dead_job(backend):
    queue = backend.queue()

    @queue.task("t", max_attempts=1)
    def t(fail: bool) -> None:
        if fail:
            raise ValueError("x")

    with backend.engine.begin() as conn:
        ok = t.enqueue(conn, fail=False)
        bad = t.enqueue(conn, fail=True)
    drain(queue)
    with pytest.raises(sqlqueue.JobStateError, match=f"job {ok} is succeeded; only dead jobs"):
        queue.requeue(ok, by="bob", reason="why not")
    with pytest.raises(sqlqueue.JobNotFound, match="there is no job 999999"):
        queue.requeue(999_999, by="bob", reason="typo")
    new_id = queue.requeue(bad, by="bob", reason="fixed")
    with pytest.raises(sqlqueue.JobStateError, match=f"already requeued as job {new_id}"):
        queue.requeue(bad, by="carol", reason="again")
    with pytest.raises(sqlqueue.ConfigurationError, match="by= "):
        queue.requeue(bad, by="", reason="")


def test_an_error_message_no_database_can_store_is_escaped_and_the_worker_goes_on(backend):
    """A NUL or a lone surrogate (a path decoded with surrogateescape) in an exception: the
    failure lands with the characters escaped, and the jobs after it still run."""
    queue = backend.queue()
    ran: list[int] = []

    @queue.task("unstorable", max_attempts=1)
    def unstorable() -> None:
        raise OSError("cannot open '/tmp/\udcffname\x00': bad bytes")

    @queue.task("fine")
    def fine(n: int) -> None:
        ran.append(n)

    with backend.engine.begin() as conn:
        bad = unstorable.enqueue(conn)
        for n in range(3):
            fine.enqueue(conn, n=n)
    drain(queue)
    job = queue.get_job(bad)
    assert job is not None
    assert job.status == "dead"
    assert job.last_error == "OSError: cannot open '/tmp/\\udcffname\\x00': bad bytes"
    assert "\\udcffname\\x00" in str(job.errors[-1].details["traceback"])
    assert sorted(ran) == [0, 1, 2]


def test_a_handler_that_raises_mid_read_leaves_no_stale_connection_in_the_pool(backend):
    """A handler that raises while it streams a query has an unfinished cursor in its frame. The
    worker keeps the error's text, never its frames: held by the traceback (until a garbage
    collection, which may be minutes away), that cursor kept its pooled SQLite connection's read
    snapshot open, and the next job handed that connection read old rows and could not write
    ("the SQLite database stayed locked")."""
    queue = sqlqueue.Queue(backend.url)
    numbers = sa.Table(
        "numbers", sa.MetaData(), sa.Column("n", sa.Integer, primary_key=True, autoincrement=False)
    )
    numbers.metadata.create_all(queue.engine)
    with queue.engine.begin() as conn:
        conn.execute(numbers.insert(), [{"n": n} for n in range(1, 501)])

    @queue.task("scan", max_attempts=1)
    def scan(ctx: sqlqueue.JobContext) -> None:
        with ctx.engine.connect() as reader:
            rows = reader.execution_options(yield_per=10).execute(sa.select(numbers.c.n))
            for _partition in rows.partitions():
                raise ValueError("row 0 is bad")

    gc.disable()  # only reference counting frees the cursor: what a long-lived worker sees
    try:
        with queue.engine.begin() as conn:
            job_id = queue.enqueue(conn, "scan", {})
        drain(queue)
        job = queue.get_job(job_id)
        assert job is not None
        assert (job.status, job.last_error) == ("dead", "ValueError: row 0 is bad")
        details = job.errors[0].details
        assert details is not None
        assert 'raise ValueError("row 0 is bad")' in details["traceback"]

        with backend.engine.begin() as conn:  # another process's write, after the failure
            conn.execute(numbers.insert().values(n=1000))
        pool = queue.engine.pool
        assert isinstance(pool, sa.QueuePool)
        pooled = [queue.engine.connect() for _ in range(max(pool.checkedin(), 1))]
        try:
            for conn in pooled:
                seen = conn.execute(sa.select(sa.func.count()).where(numbers.c.n == 1000))
                assert seen.scalar_one() == 1, "a pooled connection reads an old snapshot"
                conn.execute(numbers.insert().values(n=2000 + len(pooled)))
                conn.rollback()
        finally:
            for conn in pooled:
                conn.close()
    finally:
        gc.enable()
        queue.engine.dispose()
