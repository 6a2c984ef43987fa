"""Leases, heartbeats, the reaper, and fenced transitions (store level, with injected time)."""

from __future__ import annotations

import threading
from datetime import timedelta

import sqlqueue
from sqlqueue._store.rows import Failure
from sqlqueue._worker.reaper import Reaper


def _one_job(backend, max_attempts=3):
    queue = backend.queue(lease_seconds=30)

    @queue.task("work", max_attempts=max_attempts)
    def work() -> None:
        pass

    with backend.engine.begin() as conn:
        job_id = work.enqueue(conn)
    return queue, job_id


def _claim(queue, worker_id, now=None):
    return queue.store.claim(
        queues=["default"], job_types=None, limit=10, worker_id=worker_id, lease_seconds=30, now=now
    )


def test_claim_leases_the_job_to_the_worker_by_the_database_clock(backend):
    queue, job_id = _one_job(backend)
    [job] = _claim(queue, "w1")
    assert (job.id, job.attempt) == (job_id, 1)
    assert job.lease_expires_at - job.started_at == timedelta(seconds=30)
    row = queue.get_job(job_id)
    assert (row.status, row.locked_by, row.attempts) == ("running", "w1", 1)
    assert _claim(queue, "w2") == []  # nobody else gets it


def test_reaper_leaves_live_leases_and_recovers_expired_ones(backend):
    queue, job_id = _one_job(backend)
    [job] = _claim(queue, "w1")
    reaper = Reaper(queue.store)
    assert reaper.run_once(now=job.lease_expires_at - timedelta(seconds=1)).retried == ()
    result = reaper.run_once(now=job.lease_expires_at + timedelta(seconds=1))
    assert result.retried == (job_id,)
    row = queue.get_job(job_id)
    assert (row.status, row.attempts) == ("failed", 1)
    assert row.next_run_at == job.lease_expires_at + timedelta(seconds=1)  # retry at once
    assert row.errors[-1].kind == "LeaseExpired"
    assert "worker w1 stopped heartbeating" in row.last_error


def test_reaper_moves_a_job_with_no_attempts_left_to_dead(backend):
    queue, job_id = _one_job(backend, max_attempts=1)
    [job] = _claim(queue, "w1")
    result = Reaper(queue.store).run_once(now=job.lease_expires_at + timedelta(seconds=1))
    assert result.dead == (job_id,)
    row = queue.get_job(job_id)
    assert (row.status, row.attempts) == ("dead", 1)
    assert row.finished_at is not None


def test_a_late_worker_cannot_overwrite_the_newer_lease(backend):
    queue, job_id = _one_job(backend)
    [first] = _claim(queue, "w1")
    later = first.lease_expires_at + timedelta(seconds=1)
    Reaper(queue.store).run_once(now=later)
    [second] = _claim(queue, "w2", now=later)
    assert second.attempt == 2
    # w1 wakes up: its heartbeat, completion, failure and release all change nothing.
    store = queue.store
    assert store.extend_leases(worker_id="w1", fences=[first.fence], lease_seconds=30) == {}
    assert store.finish(worker_id="w1", succeeded=[first.fence], failures=[]) == set()
    failure = Failure(job_id=job_id, attempt=1, dead=True, retry_in=0, last_error="x", errors=[])
    assert store.finish(worker_id="w1", succeeded=[], failures=[failure]) == set()
    assert store.release(worker_id="w1", fences=[first.fence]) == set()
    row = queue.get_job(job_id)
    assert (row.status, row.locked_by, row.attempts) == ("running", "w2", 2)
    # The current owner still can.
    assert store.finish(worker_id="w2", succeeded=[second.fence], failures=[]) == {job_id}
    assert queue.get_job(job_id).status == "succeeded"


def test_the_same_worker_cannot_complete_an_older_attempt(backend):
    queue, job_id = _one_job(backend)
    [first] = _claim(queue, "w1")
    later = first.lease_expires_at + timedelta(seconds=1)
    Reaper(queue.store).run_once(now=later)
    [second] = _claim(queue, "w1", now=later)
    assert queue.store.finish(worker_id="w1", succeeded=[first.fence], failures=[]) == set()
    assert queue.get_job(job_id).status == "running"
    assert queue.store.finish(worker_id="w1", succeeded=[second.fence], failures=[]) == {job_id}


def test_a_late_completion_cannot_overwrite_a_job_the_reaper_failed_and_nobody_claimed(backend):
    # The reaper gives the job back (failed, to retry) and no worker has claimed it yet: the row
    # still names w1 and attempt 1, so only the ``running`` part of the fence stops w1.
    queue, job_id = _one_job(backend)
    [first] = _claim(queue, "w1")
    later = first.lease_expires_at + timedelta(seconds=1)
    assert Reaper(queue.store).run_once(now=later).retried == (job_id,)
    store = queue.store
    assert store.finish(worker_id="w1", succeeded=[first.fence], failures=[]) == set()
    failure = Failure(job_id=job_id, attempt=1, dead=True, retry_in=0, last_error="x", errors=[])
    assert store.finish(worker_id="w1", succeeded=[], failures=[failure]) == set()
    assert store.release(worker_id="w1", fences=[first.fence]) == set()
    assert store.extend_leases(worker_id="w1", fences=[first.fence], lease_seconds=30) == {}
    row = queue.get_job(job_id)
    assert (row.status, row.attempts, row.finished_at) == ("failed", 1, None)
    assert row.errors[-1].kind == "LeaseExpired"
    # It still retries: the next claim runs attempt 2, and that one completes.
    [second] = _claim(queue, "w2", now=later)
    assert (second.id, second.attempt) == (job_id, 2)
    assert store.finish(worker_id="w2", succeeded=[second.fence], failures=[]) == {job_id}
    assert queue.get_job(job_id).status == "succeeded"


def test_reaper_racing_a_completion_leaves_the_job_succeeded(backend):
    queue, job_id = _one_job(backend)
    [job] = _claim(queue, "w1")
    assert queue.store.finish(worker_id="w1", succeeded=[job.fence], failures=[]) == {job_id}
    result = Reaper(queue.store).run_once(now=job.lease_expires_at + timedelta(hours=1))
    assert result.retried == result.dead == ()
    assert queue.get_job(job_id).status == "succeeded"


def test_concurrent_reapers_recover_each_job_once(backend):
    queue = backend.queue(lease_seconds=30)

    @queue.task("work")
    def work() -> None:
        pass

    with backend.engine.begin() as conn:
        ids = work.enqueue_many(conn, [{} for _ in range(200)])
    claimed = queue.store.claim(
        queues=["default"], job_types=None, limit=200, worker_id="w", lease_seconds=30
    )
    assert len(claimed) == 200
    later = max(job.lease_expires_at for job in claimed) + timedelta(seconds=1)
    results: list[sqlqueue._worker.reaper.ReapResult] = []

    def reap() -> None:
        reaper = Reaper(queue.store, batch_size=50)
        while True:
            result = reaper.run_once(now=later)
            if not result.retried:
                return
            results.append(result)

    threads = [threading.Thread(target=reap) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    reaped = [job_id for result in results for job_id in result.retried]
    assert sorted(reaped) == sorted(ids)
    for job_id in ids[:20]:
        assert [e.kind for e in queue.get_job(job_id).errors] == ["LeaseExpired"]


def test_heartbeat_extends_the_lease_from_the_database_clock(backend):
    queue, job_id = _one_job(backend)
    [job] = _claim(queue, "w1")
    held = queue.store.extend_leases(worker_id="w1", fences=[job.fence], lease_seconds=300)
    assert held == {job_id: False}
    row = queue.get_job(job_id)
    assert row.lease_expires_at >= job.lease_expires_at + timedelta(seconds=260)


def test_release_returns_the_job_without_burning_the_attempt(backend):
    queue, job_id = _one_job(backend)
    [job] = _claim(queue, "w1")
    assert queue.store.release(worker_id="w1", fences=[job.fence]) == {job_id}
    row = queue.get_job(job_id)
    assert (row.status, row.attempts, row.locked_by, row.lease_expires_at) == (
        "queued",
        0,
        None,
        None,
    )
    [again] = _claim(queue, "w2")
    assert again.attempt == 1


def test_claim_never_returns_more_than_its_limit_and_orders_by_priority(backend):
    queue = backend.queue()

    @queue.task("work")
    def work(n: int) -> None:
        pass

    with backend.engine.begin() as conn:
        low = [work.options(priority=5).enqueue(conn, n=n) for n in range(5)]
        high = [work.options(priority=-5).enqueue(conn, n=n) for n in range(3)]
    first = queue.store.claim(
        queues=["default"], job_types=None, limit=4, worker_id="w", lease_seconds=30
    )
    assert [job.id for job in first] == [*high, low[0]]


def test_heartbeat_reports_the_leases_it_lost(backend, caplog):
    from sqlqueue._worker.heartbeat import Heartbeat
    from sqlqueue._worker.registry import Registration

    queue, job_id = _one_job(backend)
    [job] = _claim(queue, "w1")
    registration = Registration(
        queue.admin, worker_id="w1", queues={"default": 1}, job_types=None, interval=10
    )
    beat = Heartbeat(queue.store, registration=registration, lease_seconds=30)
    assert (
        beat.run_once([job], still_running=lambda _: True, running=1, stopping=False).lost == set()
    )
    Reaper(queue.store).run_once(now=job.lease_expires_at + timedelta(hours=1))
    lost = beat.run_once([job], still_running=lambda _: True, running=1, stopping=False).lost
    assert lost == {job_id}
    assert f"lost the lease on running job {job_id}" in caplog.text


# -- jobs claimed ahead of a free slot: leased, not started until their start is recorded -------


def _claim_ahead(queue, worker_id, now=None):
    _, [claimed] = queue.store.cycle(
        worker_id=worker_id,
        succeeded=(),
        failures=(),
        results=None,
        claims=[(["default"], 10)],
        ahead=[True],
        job_types=None,
        lease_seconds=30,
        now=now,
    )
    return claimed


def _record_starts(queue, worker_id, fences):
    queue.store.cycle(
        worker_id=worker_id,
        succeeded=(),
        failures=(),
        results=None,
        claims=[],
        started=fences,
        job_types=None,
        lease_seconds=30,
    )


def test_a_job_claimed_ahead_is_leased_with_no_start_and_reads_the_claim_time(backend):
    queue, job_id = _one_job(backend)
    [job] = _claim_ahead(queue, "w1")
    assert job.lease_expires_at - job.started_at == timedelta(seconds=30)  # the claim's time
    row = queue.get_job(job_id)
    assert (row.status, row.locked_by, row.attempts, row.started_at) == ("running", "w1", 1, None)


def test_the_reaper_gives_a_never_started_job_its_attempt_back(backend):
    queue, job_id = _one_job(backend)
    [job] = _claim_ahead(queue, "w1")
    later = job.lease_expires_at + timedelta(seconds=1)
    assert Reaper(queue.store).run_once(now=later).retried == (job_id,)
    row = queue.get_job(job_id)
    assert (row.status, row.attempts, row.locked_by, row.last_error) == ("queued", 0, None, None)
    assert row.next_run_at == later  # due at once
    assert [(e.kind, e.attempt) for e in row.errors] == [("NotStarted", 1)]
    assert "worker w1 had claimed it ahead" in row.errors[0].error
    [again] = _claim(queue, "w2", now=later)
    assert again.attempt == 1  # the same attempt number, under another worker's lease


def test_a_recorded_start_makes_the_reaper_count_the_attempt(backend):
    queue, job_id = _one_job(backend)
    [job] = _claim_ahead(queue, "w1")
    _record_starts(queue, "w2", [job.fence])  # not w2's lease: nothing recorded
    assert queue.get_job(job_id).started_at is None
    _record_starts(queue, "w1", [job.fence])
    assert queue.get_job(job_id).started_at is not None
    Reaper(queue.store).run_once(now=job.lease_expires_at + timedelta(seconds=1))
    row = queue.get_job(job_id)
    assert (row.status, row.attempts, row.errors[-1].kind) == ("failed", 1, "LeaseExpired")


def test_an_outcome_records_the_start_of_a_job_claimed_ahead(backend):
    queue, job_id = _one_job(backend)
    [job] = _claim_ahead(queue, "w1")
    assert queue.store.finish(worker_id="w1", succeeded=[job.fence], failures=()) == {job_id}
    row = queue.get_job(job_id)
    assert row.status == "succeeded"
    assert row.started_at is not None
    assert row.started_at <= row.finished_at


def test_a_job_that_never_starts_max_attempts_times_then_has_its_attempts_counted(backend):
    # A job that kills its worker a moment after starting, before the start is recorded,
    # must not come back forever: after max_attempts give-backs, the reaper counts them.
    queue, job_id = _one_job(backend, max_attempts=2)
    reaper = Reaper(queue.store)
    kinds = []
    now = None
    for _ in range(4):
        [job] = _claim_ahead(queue, "w1", now=now)
        now = job.lease_expires_at + timedelta(seconds=1)
        reaper.run_once(now=now)
        row = queue.get_job(job_id)
        kinds.append((row.status, row.attempts, row.errors[-1].kind))
    assert kinds == [
        ("queued", 0, "NotStarted"),
        ("queued", 0, "NotStarted"),
        ("failed", 1, "LeaseExpired"),
        ("dead", 2, "LeaseExpired"),
    ]
