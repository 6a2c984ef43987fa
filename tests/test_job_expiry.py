"""Job expiry on every backend: a job not started by its ``expires_in``/``expires_at`` is
cancelled with reason ``expired`` and its handler never runs; a job claimed in time runs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

import sqlqueue
from sqlqueue._expiry import expiry_of
from tests._support import WorkerThread, count_jobs, db_now, drain, wait_until


def _queue(backend):
    queue = backend.queue()
    ran: list[str] = []

    @queue.task("send_code")
    def send_code(code: str) -> None:
        ran.append(code)

    return queue, send_code, ran


def test_an_expired_job_is_cancelled_with_reason_expired_and_never_runs(backend):
    queue, send_code, ran = _queue(backend)
    with queue.engine.begin() as conn:
        stale = send_code.options(expires_in=0.5).enqueue(conn, code="123456")
        past = queue.enqueue(
            conn, "send_code", {"code": "past"}, expires_at=datetime.now(UTC) - timedelta(1)
        )
        fresh = send_code.options(expires_in=3600).enqueue(conn, code="fresh")
        plain = send_code.enqueue(conn, code="plain")
    stale_job = queue.get_job(stale)
    assert stale_job is not None
    assert stale_job.status == "queued"
    # The database clock passes the expiry before any worker looks.
    expires = datetime.now(UTC) + timedelta(seconds=0.5)
    wait_until(lambda: db_now(backend.engine) > expires, what="the database clock to pass it")
    with WorkerThread(queue.worker(poll_interval=0.05)):
        wait_until(
            lambda: {queue.get_job(i).status for i in (stale, past)} == {"cancelled"},
            what="the expired jobs to be cancelled",
        )
        wait_until(lambda: count_jobs(backend.engine, status="succeeded") == 2)
    assert sorted(ran) == ["fresh", "plain"]
    for job_id in (stale, past):
        actions = queue.job_actions(job_id)
        assert [(a.action, a.reason) for a in actions] == [("cancel", "expired")]
    assert queue.get_job(fresh).status == "succeeded"
    assert queue.get_job(plain).status == "succeeded"


def test_the_claim_never_takes_an_expired_job(backend):
    queue, _send_code, ran = _queue(backend)
    with queue.engine.begin() as conn:
        job_id = queue.enqueue(
            conn, "send_code", {"code": "x"}, expires_at=datetime.now(UTC) - timedelta(1)
        )
    claimed = queue.store.claim(
        queues=["default"], job_types=None, limit=10, worker_id="w", lease_seconds=30
    )
    assert claimed == []
    job = queue.get_job(job_id)
    assert job is not None
    assert job.status == "queued"
    assert ran == []


def test_a_job_claimed_in_time_runs(backend):
    queue, send_code, ran = _queue(backend)
    with queue.engine.begin() as conn:
        job_id = send_code.options(expires_in=600).enqueue(conn, code="ok")
    drain(queue)
    assert ran == ["ok"]
    assert queue.get_job(job_id).status == "succeeded"


def test_enqueue_many_carries_expiry(backend):
    queue, _, _ = _queue(backend)
    past = datetime.now(UTC) - timedelta(hours=1)
    with queue.engine.begin() as conn:
        ids = queue.enqueue_many(
            conn,
            [
                sqlqueue.JobRequest(job_type="send_code", payload={"code": "a"}, expires_at=past),
                sqlqueue.JobRequest(job_type="send_code", payload={"code": "b"}),
            ],
        )
    claimed = queue.store.claim(
        queues=["default"], job_types=None, limit=10, worker_id="w", lease_seconds=30
    )
    assert [job.id for job in claimed] == [ids[1]]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"expires_in": 0}, "expires_in must be > 0"),
        ({"expires_in": -1}, "expires_in must be >= 0"),
        ({"expires_in": "soon"}, "expires_in must be a number of seconds"),
        ({"expires_at": datetime(2030, 1, 1)}, "expires_at must be a timezone-aware datetime"),
        (
            {"expires_in": 5, "expires_at": datetime(2030, 1, 1, tzinfo=UTC)},
            "either expires_in or expires_at",
        ),
    ],
)
def test_bad_expiry_is_refused_before_any_sql(backend, options, message):
    queue, _, _ = _queue(backend)
    with queue.engine.begin() as conn, pytest.raises(sqlqueue.EnqueueError, match=message):
        queue.enqueue(conn, "send_code", {"code": "x"}, **options)
    assert count_jobs(backend.engine) == 0


@given(seconds=st.floats(min_value=0.001, max_value=10 * 365 * 86400))
def test_any_positive_expires_in_gives_an_aware_utc_moment(seconds):
    before = datetime.now(UTC)
    moment = expiry_of(seconds, None)
    assert moment is not None
    assert moment.tzinfo is UTC
    assert before < moment <= datetime.now(UTC) + timedelta(seconds=seconds)


@given(value=st.one_of(st.text(), st.booleans(), st.floats(max_value=0), st.lists(st.integers())))
def test_any_other_expires_in_is_refused(value):
    with pytest.raises(sqlqueue.EnqueueError):
        expiry_of(value, None)
