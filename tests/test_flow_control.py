"""Flow control in one process: per-queue slots, priorities, groups, delays, snooze, cancel."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest

import sqlqueue
from sqlqueue.testing import age_jobs
from tests._support import WorkerThread, count_jobs, drain, wait_until


def test_a_flood_of_reports_does_not_delay_a_password_reset_email(backend):
    queue = backend.queue()
    email_started = threading.Event()

    @queue.task("report", queue="reports")
    def report(n: int) -> None:
        # Each report holds the reports' one slot until the email has started: behind them,
        # with no slot of its own, the email could never start.
        email_started.wait(60)

    @queue.task("password_reset", queue="mail")
    def password_reset(user_id: int) -> None:
        email_started.set()

    with backend.engine.begin() as conn:
        report.enqueue_many(conn, [{"n": n} for n in range(1000)])
    worker = queue.worker(queues={"reports": 1, "mail": 1}, poll_interval=0.05)
    with WorkerThread(worker):
        wait_until(lambda: count_jobs(backend.engine, status="running") >= 1)
        with backend.engine.begin() as conn:
            email_id = password_reset.enqueue(conn, user_id=7)
        enqueued = time.monotonic()
        assert email_started.wait(30)
        latency = time.monotonic() - enqueued
        queued = count_jobs(backend.engine, status="queued")
        wait_until(lambda: queue.get_job(email_id).status == "succeeded")
    print(
        f"\n    [{backend.name}] password-reset start latency behind 1,000 reports: {latency:.3f} s"
    )
    assert queued > 900  # the reports were still queued when the email started


def test_a_shared_pool_is_one_limit_for_several_queues(backend):
    queue = backend.queue()
    running = 0
    peak = 0
    lock = threading.Lock()

    def busy() -> None:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        time.sleep(0.05)
        with lock:
            running -= 1

    queue.task("a", queue="one")(busy)
    queue.task("b", queue="two")(busy)
    with backend.engine.begin() as conn:
        queue.enqueue_many(
            conn,
            [sqlqueue.JobRequest(job_type=t, payload={}) for t in ("a", "b") for _ in range(10)],
        )
    drain(queue, queues=["one", "two"], concurrency=2)
    assert peak == 2
    assert count_jobs(backend.engine, status="succeeded") == 20


def test_higher_priority_runs_first_and_equal_priority_in_due_order(backend):
    queue = backend.queue()
    order: list[str] = []

    @queue.task("t")
    def t(name: str) -> None:
        order.append(name)

    with backend.engine.begin() as conn:
        t.options(priority=5).enqueue(conn, name="low-1")
        t.options(priority=5).enqueue(conn, name="low-2")
        t.options(priority=-5).enqueue(conn, name="urgent")
        t.enqueue(conn, name="normal")
    drain(queue, concurrency=1)
    assert order == ["urgent", "normal", "low-1", "low-2"]


def test_a_delayed_job_is_not_run_before_its_time(backend):
    queue = backend.queue()
    ran_at: list[float] = []

    @queue.task("later")
    def later() -> None:
        ran_at.append(time.monotonic())

    with backend.engine.begin() as conn:
        job_id = later.options(delay=1.0).enqueue(conn)
    enqueued = time.monotonic()
    drain(queue)
    assert ran_at == []  # nothing was due: burst mode returned without running it
    with WorkerThread(queue.worker(poll_interval=0.05)):
        wait_until(lambda: queue.get_job(job_id).status == "succeeded", timeout=10)
    assert ran_at[0] - enqueued >= 0.95
    job = queue.get_job(job_id)
    assert job.started_at >= job.next_run_at


def test_jobs_of_one_group_run_one_at_a_time_in_enqueue_order(backend):
    queue = backend.queue()
    lock = threading.Lock()
    active: dict[str, int] = {}
    overlaps: list[str] = []
    order: dict[str, list[int]] = {}

    @queue.task("sync_account", backoff=[0])
    def sync_account(account: str, n: int, fail_once: bool = False) -> None:
        with lock:
            if active.get(account):
                overlaps.append(account)
            active[account] = active.get(account, 0) + 1
            order.setdefault(account, []).append(n)
        time.sleep(0.01)
        with lock:
            active[account] -= 1
        if fail_once and order[account].count(n) == 1:
            raise ConnectionError("flaky")

    with backend.engine.begin() as conn:
        for n in range(6):
            for account in ("a", "b", "c"):
                sync_account.options(group_key=f"account:{account}").enqueue(
                    conn, account=account, n=n, fail_once=(account == "b" and n == 2)
                )
    for _ in range(3):
        drain(queue, concurrency=6)
    assert overlaps == []
    assert order["a"] == order["c"] == [0, 1, 2, 3, 4, 5]
    # b's job 2 failed once and was retried before anything after it ran.
    assert order["b"] == [0, 1, 2, 2, 3, 4, 5]
    assert count_jobs(backend.engine, status="succeeded") == 18


def test_the_claim_never_takes_two_jobs_of_one_group(backend):
    queue = backend.queue()
    queue.task("t")(lambda: None)
    with backend.engine.begin() as conn:
        ids = [queue.enqueue(conn, "t", {}, group_key="g") for _ in range(5)]
        free = queue.enqueue(conn, "t", {})
    claimed = queue.store.claim(
        queues=["default"], job_types=None, limit=10, worker_id="w", lease_seconds=30
    )
    assert sorted(job.id for job in claimed) == [ids[0], free]
    again = queue.store.claim(
        queues=["default"], job_types=None, limit=10, worker_id="w", lease_seconds=30
    )
    assert again == []  # ids[0] still runs


def test_snooze_runs_again_later_without_counting_an_attempt(backend):
    queue = backend.queue()
    calls: list[int] = []

    @queue.task("poll_export", max_attempts=1)
    def poll_export() -> None:
        calls.append(1)
        if len(calls) < 3:
            raise sqlqueue.Snooze(3600, reason="export not ready")

    with backend.engine.begin() as conn:
        job_id = poll_export.enqueue(conn)
    drain(queue)
    job = queue.get_job(job_id)
    assert (job.status, job.attempts, job.errors, job.last_error) == ("queued", 0, (), None)
    # The snooze and its due time are one statement: due an hour after the row was written.
    assert (job.next_run_at - job.updated_at).total_seconds() == pytest.approx(3600, abs=0.01)
    for _ in range(2):  # the hour passes (the job is aged by it), and it runs again
        age_jobs(queue, [job_id], by=timedelta(hours=1))
        drain(queue)
    job = queue.get_job(job_id)
    assert (job.status, job.attempts, len(calls)) == ("succeeded", 1, 3)  # max_attempts=1 unused


def test_cancel_a_queued_or_failed_job_and_by_filter(backend):
    queue = backend.queue()

    @queue.task("t", backoff=[3600])
    def t(fail: bool = False) -> None:
        if fail:
            raise ValueError("x")

    with backend.engine.begin() as conn:
        queued = t.enqueue(conn)
        failed = t.enqueue(conn, fail=True)
    drain(queue, concurrency=1)
    # The healthy job ran; the failing one waits for its retry.
    assert queue.get_job(queued).status == "succeeded"
    assert queue.get_job(failed).status == "failed"
    with backend.engine.begin() as conn:
        waiting = t.options(delay=3600).enqueue(conn)
        grouped = [t.options(group_key="tenant:9", delay=3600).enqueue(conn) for _ in range(3)]
    assert queue.cancel(failed).status == "cancelled"
    assert queue.cancel(waiting).status == "cancelled"
    assert queue.get_job(waiting).finished_at is not None
    with pytest.raises(sqlqueue.JobStateError, match=f"job {queued} is succeeded"):
        queue.cancel(queued)
    with pytest.raises(sqlqueue.JobNotFound):
        queue.cancel(10**9)
    assert queue.cancel_where(group_key="tenant:9") == 3
    assert {queue.get_job(job_id).status for job_id in grouped} == {"cancelled"}
    with pytest.raises(sqlqueue.ConfigurationError, match="at least one"):
        queue.cancel_where()
    drain(queue)
    assert count_jobs(backend.engine, status="cancelled") == 5


def test_a_running_job_can_be_asked_to_stop(backend):
    queue = backend.queue(lease_seconds=1.5)  # heartbeats every 0.5 s notice the request
    started = threading.Event()

    @queue.task("export", backoff=[0])
    def export(ctx: sqlqueue.JobContext) -> None:
        started.set()
        deadline = time.monotonic() + 20
        while not ctx.cancelled and time.monotonic() < deadline:
            time.sleep(0.01)
        raise RuntimeError("stopped on request")

    with backend.engine.begin() as conn:
        job_id = export.enqueue(conn)
    with WorkerThread(queue.worker(poll_interval=0.05)):
        assert started.wait(20)
        job = queue.cancel(job_id)
        assert job.status == "running"
        assert job.cancel_requested_at is not None
        wait_until(lambda: queue.get_job(job_id).status == "cancelled", timeout=10)
    job = queue.get_job(job_id)
    assert job.attempts == 1  # cancelled, not retried
    assert job.last_error == "RuntimeError: stopped on request"
