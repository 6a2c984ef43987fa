"""A failed attempt gives back what it held at once: the worker's slot, and the task's
concurrency slot.

Two blind spots a mutation check found (issue 43): a worker that never forgot the lease of a
failed attempt passed every test (with one slot it stopped claiming after its first failures),
and a failed attempt that kept its concurrency slot was caught only by a 120 s timeout. Here
each shows in one burst run of one worker (``drain`` starts a new worker for each of its
rounds, which forgot what the last one leaked): the jobs after the failures run in it, or
they do not.
"""

from __future__ import annotations

import threading

import sqlqueue
from tests._support import wait_until
from tests.conftest import Backend


def _job(queue: sqlqueue.Queue, job_id: int) -> sqlqueue.Job:
    """Job ``job_id``, which the test knows is there."""
    job = queue.get_job(job_id)
    assert job is not None, job_id
    return job


#: More failures than one slot's lease cap (two per slot, plus its claims ahead).
FAILING = 10
GOOD = 3


def _burst(queue: sqlqueue.Queue, *, concurrency: int) -> None:
    """One worker, run until no job is due and none runs."""
    worker = queue.worker(concurrency=concurrency, poll_interval=0.05, listen=False)
    runner = threading.Thread(target=worker.run, kwargs={"burst": True}, daemon=True)
    runner.start()
    runner.join(120)
    assert not runner.is_alive(), "the burst worker never ended"


def test_one_slot_runs_good_jobs_after_failing_ones(backend: Backend) -> None:
    queue = backend.queue()

    @queue.task("fails", max_attempts=2, backoff=[3600])
    def fails(n: int) -> None:
        raise ConnectionError("the endpoint is down")

    @queue.task("dies", max_attempts=1)
    def dies(n: int) -> None:
        raise ValueError("bad input")

    @queue.task("good")
    def good(n: int) -> int:
        return n

    with backend.engine.begin() as conn:  # in id order: the failures are claimed first
        failing = [fails.enqueue(conn, n=n) for n in range(FAILING)]
        dying = [dies.enqueue(conn, n=n) for n in range(FAILING)]
        ids = [good.enqueue(conn, n=n) for n in range(GOOD)]
    _burst(queue, concurrency=1)

    assert [_job(queue, job_id).status.value for job_id in failing] == ["failed"] * FAILING
    assert [_job(queue, job_id).status.value for job_id in dying] == ["dead"] * FAILING
    assert [_job(queue, job_id).status.value for job_id in ids] == ["succeeded"] * GOOD


def test_a_failed_attempt_frees_its_concurrency_slot_at_once(backend: Backend) -> None:
    """``Concurrency(limit=1)``: the second job can run only once the first attempt's slot is
    free. It fails (to be retried in an hour), and the second runs in the same drain."""
    queue = backend.queue()

    @queue.task(
        "sync.crm",
        max_attempts=3,
        backoff=[3600],
        concurrency=sqlqueue.Concurrency(limit=1),
    )
    def sync_crm(n: int) -> int:
        if n == 0:
            raise ConnectionError("503 from the CRM")
        return n

    with backend.engine.begin() as conn:
        first = sync_crm.enqueue(conn, n=0)
        second = sync_crm.enqueue(conn, n=1)
    _burst(queue, concurrency=2)

    assert _job(queue, first).status.value == "failed"
    assert _job(queue, second).status.value == "succeeded"


def test_one_slot_claims_jobs_that_come_after_its_failures(backend: Backend) -> None:
    """A running worker with one slot and a lease far longer than the test (its heartbeat,
    which would drop a forgotten lease, never comes): after a run of failures it still claims
    the jobs enqueued next. A worker that kept the leases of failed attempts counted them as
    outcomes not yet written and stopped claiming at its cap, until a heartbeat."""
    queue = backend.queue(lease_seconds=600)

    @queue.task("fails", max_attempts=2, backoff=[3600])
    def fails(n: int) -> None:
        raise ConnectionError("the endpoint is down")

    @queue.task("good")
    def good(n: int) -> int:
        return n

    worker = queue.worker(concurrency=1, poll_interval=0.05, listen=False)
    runner = threading.Thread(target=worker.run, daemon=True)
    runner.start()
    try:
        with backend.engine.begin() as conn:
            failing = [fails.enqueue(conn, n=n) for n in range(FAILING)]
        wait_until(
            lambda: all(_job(queue, job_id).status.value == "failed" for job_id in failing),
            timeout=60,
            what="every failing job's first attempt",
        )
        with backend.engine.begin() as conn:
            ids = [good.enqueue(conn, n=n) for n in range(GOOD)]
        # Seconds at most for a worker that claims; its next heartbeat is 200 s away.
        wait_until(
            lambda: all(_job(queue, job_id).status.value == "succeeded" for job_id in ids),
            timeout=60,
            what="the good jobs enqueued after the failures",
        )
    finally:
        worker.stop()
        runner.join(60)
    assert not runner.is_alive()
