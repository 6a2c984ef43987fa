"""The database fails as a worker starts (its first read of the paused queues), as a burst
worker takes its last look, or as a handler's progress is written: a statement raises a real
driver error (``FailStatements``, SQLAlchemy's ``before_cursor_execute`` event on the real
engine; sqlqueue itself is untouched).

A burst worker (a cron job, a CI step) must not wait for a database it cannot read: it stops at
once with the error, having claimed nothing and registered nothing, and the next run drains the
queue. A long-running worker keeps the last pauses it knew (none yet), says so once, and serves.
A failed last look is not "empty": the burst worker looks again and ends drained. A progress
report that cannot be written is logged and dropped (the next one carries the latest state); the
handler goes on.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter

import pytest

import sqlqueue
from tests._support import WorkerThread, drain, wait_until
from tests.apps.statement_faults import FailStatements, transient_error

#: The worker's read of the paused queues (with the queues' limits), as every backend spells it.
PAUSES = (
    r"SELECT sqlqueue_queues\.name, sqlqueue_queues\.paused_at, sqlqueue_queues\.max_running\s+"
    r"FROM sqlqueue_queues\s+WHERE"
)


def _counted_queue(backend) -> tuple[sqlqueue.Queue, Counter[int], int]:
    """A queue with one ``t`` job enqueued, and the runs of each job's ``n``."""
    queue = backend.queue()
    runs: Counter[int] = Counter()

    @queue.task("t")
    def t(n: int) -> None:
        runs[n] += 1

    with backend.engine.begin() as conn:
        job_id = t.enqueue(conn, n=1)
    return queue, runs, job_id


def test_a_burst_worker_whose_first_read_of_the_pauses_fails_stops_at_once_with_the_error(
    backend, caplog
):
    queue, runs, job_id = _counted_queue(backend)
    caplog.set_level(logging.INFO, logger="sqlqueue")
    with (
        FailStatements(backend.engine, PAUSES) as failing,
        pytest.raises(sqlqueue.DatabaseUnavailable) as raised,
    ):
        drain(queue)
    assert failing.failed == 1
    assert failing.matched == 1  # not read again: the worker stopped, it did not wait
    # The user sees the driver's own words, not a generic failure.
    assert str(transient_error(backend.engine.dialect.name).args[-1]) in str(raised.value)
    job = queue.get_job(job_id)
    assert job is not None
    assert (job.status, job.attempts) == ("queued", 0)  # never claimed: nothing to recover
    assert runs == {}
    assert queue.workers() == []  # it never registered, so no row waits to expire
    assert not [r for r in caplog.records if r.getMessage().startswith("cannot claim")]

    drain(queue)  # the next run, on a healthy database, drains the queue
    job = queue.get_job(job_id)
    assert job is not None
    assert (job.status, job.attempts) == ("succeeded", 1)
    assert runs == {1: 1}


def test_a_serving_worker_whose_first_read_of_the_pauses_fails_says_so_once_and_serves(
    backend, caplog
):
    queue, runs, job_id = _counted_queue(backend)
    caplog.set_level(logging.INFO, logger="sqlqueue")
    with (
        FailStatements(backend.engine, PAUSES) as failing,
        WorkerThread(queue.worker(poll_interval=0.05)),  # stops cleanly: no error to re-raise
    ):
        wait_until(
            lambda: (job := queue.get_job(job_id)) is not None and job.status == "succeeded",
            what="the job to run on the worker that could not read the pauses",
        )
    assert failing.failed == 1
    said = [r for r in caplog.records if r.getMessage().startswith("cannot read the paused")]
    assert len(said) == 1
    assert said[0].levelno == logging.WARNING
    job = queue.get_job(job_id)
    assert job is not None
    assert (job.status, job.attempts) == ("succeeded", 1)
    assert runs == {1: 1}


#: The reaper's read of the expired leases, as every backend spells it.
EXPIRED = r"ORDER BY sqlqueue_jobs\.lease_expires_at"


def test_a_burst_workers_last_look_that_fails_is_taken_again_and_the_worker_ends_drained(
    backend, caplog
):
    """Before a burst worker ends it reaps expired leases and claims once more; a failure there
    means "not known to be empty", so it looks again instead of ending or stopping with it."""
    queue, runs, job_id = _counted_queue(backend)
    caplog.set_level(logging.INFO, logger="sqlqueue")
    with FailStatements(backend.engine, EXPIRED, times=3) as failing:
        drain(queue)  # returns: the worker ended normally, drained
    assert failing.failed == 3
    assert failing.matched > 3  # the look after the failures landed
    job = queue.get_job(job_id)
    assert job is not None
    assert (job.status, job.attempts) == ("succeeded", 1)
    assert runs == {1: 1}


#: A handler's progress report, as every backend spells it (its SET clause, before WHERE, names
#: progress; a claim's or an outcome's starts with the status).
PROGRESS = r"UPDATE sqlqueue_jobs SET (?!status=)[^W]*\bprogress="


def test_a_progress_write_that_fails_is_logged_the_handler_goes_on_and_the_next_report_lands(
    backend, caplog
):
    queue = backend.queue(lease_seconds=60)
    first, go = threading.Event(), threading.Event()

    @queue.task("crunch")
    def crunch(ctx: sqlqueue.JobContext) -> None:
        ctx.progress(1, 2, note="first half")
        first.set()
        assert go.wait(30)
        ctx.progress(2, 2, note="second half")
        assert go.wait(30)

    with backend.engine.begin() as conn:
        job_id = crunch.enqueue(conn)
    caplog.set_level(logging.INFO, logger="sqlqueue")

    def warned() -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.getMessage().startswith("could not record progress")]

    with (
        FailStatements(backend.engine, PROGRESS) as failing,
        WorkerThread(queue.worker(poll_interval=0.05)),
    ):
        assert first.wait(30)
        (said,) = wait_until(warned, what="the worker to say the progress write failed")
        assert said.levelno == logging.WARNING
        assert "could not record progress of 1 job(s)" in said.getMessage()
        go.set()
        wait_until(
            lambda: (
                (job := queue.get_job(job_id)) is not None
                and job.progress is not None
                and job.progress.note == "second half"
            ),
            what="the next progress report to land",
        )
        wait_until(
            lambda: (job := queue.get_job(job_id)) is not None and job.status == "succeeded",
            what="the job to finish",
        )
    assert failing.failed == 1
    job = queue.get_job(job_id)
    assert job is not None
    assert (job.status, job.attempts, job.errors) == ("succeeded", 1, ())  # the handler went on
