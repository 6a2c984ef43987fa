"""No value a handler hands back can wedge a worker: a delay, an error, a result or a progress
report the database could not store is refused where the handler makes it, and an outcome
the database still refuses is recorded as a substitute failure that names the refusal.

Before, ``Retry(delay=float("inf"))`` made the outcome write fail (NOT NULL on SQLite, an
interval out of range on PostgreSQL) and the worker retried it for ever: the other outcomes of
its round waited behind it, the heartbeat kept every lease alive, and no job finished.
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import sqlqueue
from sqlqueue import Retry, Snooze
from tests._support import db_now, drain
from tests._support.refusals import MARK, refusing_outcomes
from tests.conftest import Backend


def _job(queue: sqlqueue.Queue, job_id: int) -> sqlqueue.Job:
    """Job ``job_id``, which the test knows is there."""
    job = queue.get_job(job_id)
    assert job is not None, job_id
    return job


HEALTHY = 6


def _healthy(queue: sqlqueue.Queue) -> sqlqueue.Task:
    @queue.task("healthy")
    def healthy(n: int) -> int:
        return n

    return healthy


def _enqueue(backend: Backend, task: sqlqueue.Task, count: int, **payload: Any) -> list[int]:
    with backend.engine.begin() as conn:
        return [task.enqueue(conn, **payload) for _ in range(count)]


def _statuses(queue: sqlqueue.Queue, ids: list[int]) -> list[str]:
    return [_job(queue, job_id).status for job_id in ids]


@pytest.mark.parametrize(
    ("raise_it", "says"),
    [
        pytest.param(
            lambda: Retry(delay=math.inf),
            "ConfigurationError: Retry.delay must be a finite number of seconds, got inf",
            id="retry-inf",
        ),
        pytest.param(
            lambda: Retry(delay=math.nan),
            "ConfigurationError: Retry.delay must be >= 0 seconds, got nan",
            id="retry-nan",
        ),
        pytest.param(
            lambda: Retry(delay=1e20),
            "ConfigurationError: Retry.delay=1e+20 seconds puts the job after 9999-12-31",
            id="retry-past-9999",
        ),
        pytest.param(
            lambda: Snooze(delay=1e15),
            "ConfigurationError: Snooze.delay=1000000000000000.0 seconds puts the job after",
            id="snooze-past-9999",
        ),
        pytest.param(
            lambda: Retry(delay="soon"),  # type: ignore[arg-type]
            "ConfigurationError: Retry.delay must be a number of seconds, got str 'soon'",
            id="retry-not-a-number",
        ),
    ],
)
def test_a_delay_no_database_stores_fails_the_attempt_and_the_rest_run(
    backend: Backend, raise_it: Any, says: str
) -> None:
    """What the operator sees: the attempt failed with an error naming the bad delay (the
    signal is refused where the handler makes it, so it is the handler's error), retried
    after the task's backoff like any error; the healthy jobs beside it all succeed."""
    queue = backend.queue()
    healthy = _healthy(queue)

    @queue.task("poison", max_attempts=2)
    def poison() -> None:
        raise raise_it()

    with backend.engine.begin() as conn:
        poisoned = poison.enqueue(conn)
        ids = [healthy.enqueue(conn, n=n) for n in range(HEALTHY)]
    drain(queue, concurrency=4)

    job = _job(queue, poisoned)
    assert (job.status, job.attempts) == ("failed", 1)
    assert job.last_error is not None
    assert job.last_error.startswith(says)
    assert job.next_run_at is not None
    assert job.next_run_at > db_now(backend.engine)
    assert _statuses(queue, ids) == ["succeeded"] * HEALTHY


def test_a_backoff_that_asks_for_an_unstorable_delay_retries_at_the_default_one(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    queue = backend.queue()

    class Forever:
        def delay(self, attempt: int) -> float:
            return math.inf

    @queue.task("fails", max_attempts=3, backoff=Forever())
    def fails() -> None:
        raise ConnectionError("the endpoint is down")

    with backend.engine.begin() as conn:
        job_id = fails.enqueue(conn)
    before = db_now(backend.engine)
    drain(queue)

    job = _job(queue, job_id)
    assert (job.status, job.last_error) == ("failed", "ConnectionError: the endpoint is down")
    assert job.next_run_at is not None
    assert before < job.next_run_at < before + timedelta(minutes=5)  # the default: seconds
    assert "the backoff of fails failed; using the default backoff" in caplog.text
    assert "must be a finite number of seconds, got inf" in caplog.text


def test_an_outcome_the_database_refuses_is_recorded_in_its_stead_and_the_rest_land(
    backend: Backend,
) -> None:
    """A refusal no check foresaw (here a constraint of the database's own): after three
    refusals of the outcome alone, a substitute failure naming the refusal is written
    instead. A handler that succeeded ends dead (its work is done: running it again could
    repeat it); one that failed ends failed or dead like any failure. The other outcomes of
    the same rounds land, and a job enqueued afterwards runs."""
    queue = backend.queue()
    healthy = _healthy(queue)

    @queue.task("refused.failure", max_attempts=1)
    def refused_failure() -> None:
        raise ValueError(f"an error the database refuses to store: {MARK}")

    @queue.task("refused.success")
    def refused_success() -> dict[str, str]:
        return {"note": MARK}

    with refusing_outcomes(backend.engine):
        with backend.engine.begin() as conn:
            failure = refused_failure.enqueue(conn)
            success = refused_success.enqueue(conn)
            ids = [healthy.enqueue(conn, n=n) for n in range(HEALTHY)]
        drain(queue, concurrency=4)

        assert _statuses(queue, ids) == ["succeeded"] * HEALTHY
        failed, succeeded = _job(queue, failure), _job(queue, success)
        assert failed.status == "dead"
        assert failed.last_error is not None
        assert failed.last_error.startswith(
            "the outcome could not be stored (a failure: ValueError): "
        )
        assert succeeded.status == "dead"
        assert succeeded.last_error is not None
        assert succeeded.last_error.startswith(
            "the handler succeeded, but its outcome could not be stored: "
        )
        for job in (failed, succeeded):
            error = job.last_error or ""
            assert "refused by the database" in error or "CONSTRAINT" in error
            assert MARK not in error
            assert [entry.kind for entry in job.errors] == ["OutcomeNotStored"]
            assert job.result is None

        later = _enqueue(backend, healthy, 1, n=99)
        drain(queue)
        assert _statuses(queue, later) == ["succeeded"]


@given(
    delay=st.one_of(
        st.floats(allow_nan=True, allow_infinity=True),
        st.integers(min_value=-(10**30), max_value=10**30),
    )
)
def test_any_retry_delay_ends_the_attempt(backend: Backend, delay: float) -> None:
    """Whatever number a handler passes to ``Retry``, the attempt gets an outcome: the job is
    due again after that delay, or (a delay no database stores) after its backoff with an
    error that names the delay. Never left running (a short delay has the drain run the
    second, last attempt: dead)."""
    queue = backend.queue()

    @queue.task("retries", max_attempts=2)
    def retries() -> None:
        raise Retry(delay=delay)

    with backend.engine.begin() as conn:
        job_id = retries.enqueue(conn)
    drain(queue)
    job = _job(queue, job_id)
    assert (job.status, job.attempts) in (("failed", 1), ("dead", 2))
    first = job.errors[0]
    if first.kind == "ConfigurationError":
        assert first.error.startswith("ConfigurationError: Retry.delay")
        assert not (math.isfinite(delay) and 0 <= delay <= 3e9)
    else:
        assert (first.kind, first.error) == ("Retry", "Retry: retry requested")
        assert math.isfinite(delay)
        assert delay >= 0


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)


@given(result=_JSON)
def test_any_result_ends_the_attempt(backend: Backend, result: Any) -> None:
    """Whatever a handler returns, the job ends succeeded (the result stored as given) or
    dead with a ``ResultError`` that says why it could not be stored. Never left running."""
    queue = backend.queue()

    @queue.task("returns")
    def returns() -> Any:
        return result

    with backend.engine.begin() as conn:
        job_id = returns.enqueue(conn)
    drain(queue)
    job = _job(queue, job_id)
    assert job.status in ("succeeded", "dead")
    if job.status == "dead":
        assert job.last_error is not None
        assert job.last_error.startswith("ResultError: the handler's return value cannot be")
    else:
        assert job.result == result
