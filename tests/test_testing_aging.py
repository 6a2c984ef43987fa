"""``sqlqueue.testing.age_jobs``: jobs made older without a fake clock, on every backend."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest

import sqlqueue
from sqlqueue.testing import age_jobs
from tests._support import WorkerThread, drain, enqueue, wait_until
from tests.conftest import Backend

HOUR = timedelta(hours=1)


def quick_queue(backend: Backend, **options: object) -> sqlqueue.Queue:
    queue = backend.queue(**options)

    @queue.task("mail.send", queue="mail")
    def send(n: int = 0) -> None:
        return None

    @queue.task("report", queue="reports")
    def report(n: int = 0) -> None:
        return None

    return queue


def job_of(queue: sqlqueue.Queue, job_id: int) -> sqlqueue.Job:
    job: sqlqueue.Job | None = queue.get_job(job_id)
    assert job is not None
    return job


def status_of(queue: sqlqueue.Queue, job_id: int) -> str:
    return job_of(queue, job_id).status.value


def test_every_time_of_the_chosen_jobs_moves_back_by_the_same_amount(backend: Backend) -> None:
    queue = quick_queue(backend)
    done = enqueue(queue, "mail.send", 2)
    drain(queue)
    waiting = enqueue(queue, "mail.send", 2)
    before = {job.id: job for job in queue.jobs(limit=10)}

    assert age_jobs(queue, [done[0], waiting[0]], by=HOUR) == 2

    after = {job.id: job for job in queue.jobs(limit=10)}
    for job_id in (done[0], waiting[0]):
        old, new = before[job_id], after[job_id]
        assert new.created_at == old.created_at - HOUR
        assert new.updated_at == old.updated_at - HOUR
        assert new.next_run_at == old.next_run_at - HOUR
        if old.finished_at is not None:
            assert new.finished_at == old.finished_at - HOUR
            assert old.started_at is not None
            assert new.started_at == old.started_at - HOUR
        else:
            assert (new.finished_at, new.started_at) == (None, None)
    for job_id in (done[1], waiting[1]):  # the others are untouched
        assert after[job_id] == before[job_id]
    mail = queue.stats().queues["mail"]
    assert mail.oldest_queued_age_seconds is not None
    assert mail.oldest_queued_age_seconds >= 3600


def test_status_and_job_type_choose_jobs_and_no_filter_ages_them_all(backend: Backend) -> None:
    queue = quick_queue(backend)
    enqueue(queue, "mail.send", 2)
    drain(queue)
    enqueue(queue, "mail.send", 1)
    enqueue(queue, "report", 3)

    assert age_jobs(queue, by=HOUR, status="succeeded") == 2
    assert age_jobs(queue, by=HOUR, job_type="report") == 3
    assert age_jobs(queue, by=HOUR, status=sqlqueue.JobStatus.QUEUED, job_type="report") == 3
    assert age_jobs(queue, [], by=HOUR) == 0
    assert age_jobs(queue, by=HOUR) == 6


def test_a_success_aged_past_retention_is_pruned_and_stats_stay_exact(backend: Backend) -> None:
    queue = quick_queue(backend)
    old = enqueue(queue, "mail.send", 3)
    drain(queue)
    age_jobs(queue, old, by=timedelta(days=2))
    queue.admin.fold_all_counts()  # what a worker does every minute: the three are folded in
    recent = enqueue(queue, "mail.send", 2)
    drain(queue)
    assert queue.stats().by_status["succeeded"] == 5

    # One recent success moves below the rollup's mark: it is still counted, once.
    age_jobs(queue, recent[:1], by=timedelta(days=2))
    assert queue.stats().by_status["succeeded"] == 5

    assert queue.prune(older_than=86400) == 4
    assert queue.stats().by_status["succeeded"] == 1
    assert [job.id for job in queue.jobs(status="succeeded")] == recent[1:]


def test_a_running_job_aged_past_its_lease_goes_back_to_the_queue(backend: Backend) -> None:
    queue = backend.queue(lease_seconds=3600)
    started, release = threading.Event(), threading.Event()

    @queue.task("slow")
    def slow(n: int = 0) -> None:
        started.set()
        release.wait(30)

    (job_id,) = enqueue(queue, "slow")
    first = queue.worker(poll_interval=0.05)
    with WorkerThread(first):
        assert started.wait(20)
        assert status_of(queue, job_id) == "running"
        assert age_jobs(queue, [job_id], by=timedelta(hours=2)) == 1
        # The reaper of a second worker finds the lease expired and gives the job back (the
        # first worker may claim it again at once): its history records the expiry.
        reaped = queue.worker(poll_interval=0.05, reaper_interval=0.1, queues=["nothing"])
        with WorkerThread(reaped):
            wait_until(
                lambda: any(error.kind == "LeaseExpired" for error in job_of(queue, job_id).errors),
                timeout=30,
                what="the reaper to take the job back",
            )
        release.set()


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"by": 3600}, "by must be a timedelta"),
        ({"by": timedelta(0)}, "by must be a positive timedelta"),
        ({"by": -HOUR}, "by must be a positive timedelta"),
        ({"by": HOUR, "status": "finished"}, "status must be one of"),
        ({"by": HOUR, "job_ids": 7}, "job_ids must be a list of ids"),
        ({"by": HOUR, "job_ids": "7"}, "job_ids must be a list of ids"),
    ],
)
def test_bad_arguments_are_refused_before_anything_moves(
    backend: Backend, arguments: dict[str, object], message: str
) -> None:
    queue = quick_queue(backend)
    ids = enqueue(queue, "mail.send", 1)
    before = queue.jobs(job_ids=ids)

    with pytest.raises(sqlqueue.ConfigurationError, match=message):
        age_jobs(queue, **arguments)  # type: ignore[arg-type]

    assert queue.jobs(job_ids=ids) == before
