"""The lease fences with real worker processes: a transition out of ``running`` lands only
where the row still runs under the writer's lease, its owner and its attempt both.

Each test leaves exactly one of the two checks to decide: the stale attempt of a worker that
holds the job again (same owner, older attempt), and the late outcome of a worker that gave the
job back before another took the same attempt (same attempt, other owner). The handlers
(``ledger.gated``) run until the test opens their attempt's gate, and return their attempt and
process id, so the job's result says whose outcome landed.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

import sqlqueue
from sqlqueue._store.rows import Failure
from tests._support.freezing import freeze_between_transactions
from tests.apps.ledger import create_ledger, read_ledger, register_ledger_tasks
from tests.apps.processes import WorkerProcess, Workers, wait_until
from tests.conftest import Backend

pytestmark = pytest.mark.timeout(120)

#: The stalled worker's lease: short, so the test waits little for it to expire.
LEASE = 2.0
#: Slower than the other process tests' poll: the worker is frozen at a random moment, and
#: the fewer write transactions it runs, the less likely it holds a lock the test then needs.
POLL = ("--poll-interval", "0.2")


@pytest.fixture
def queue(backend: Backend) -> sqlqueue.Queue:
    """A queue with the ledger tasks (to enqueue them) and an empty ledger table."""
    create_ledger(backend.engine)
    queue = backend.queue()
    register_ledger_tasks(queue)
    return queue


def _enqueue_gated(queue: sqlqueue.Queue, gate: Path) -> int:
    with queue.engine.begin() as conn:
        return queue.enqueue(
            conn, "ledger.gated", {"key": "gated", "gate": str(gate)}, idempotency_key="gated"
        )


def _job(queue: sqlqueue.Queue, job_id: int) -> sqlqueue.Job:
    job = queue.get_job(job_id)
    assert job is not None, f"job {job_id} vanished"
    return job


def _started(backend: Backend, attempt: int, worker: WorkerProcess) -> None:
    """Wait until ``worker`` has started ``attempt`` of the one job."""
    wait_until(
        lambda: any(
            (row.attempt, row.pid) == (attempt, worker.pid) for row in read_ledger(backend.engine)
        ),
        timeout=30,
        what=f"attempt {attempt} to start in worker {worker.pid}",
        explain=worker.describe,
    )


def _open(gate: Path, attempt: int) -> None:
    Path(f"{gate}.{attempt}").touch()


def test_a_worker_cannot_complete_its_own_older_attempt_of_a_job_it_holds_again(
    backend: Backend, queue: sqlqueue.Queue, workers: Workers, tmp_path: Path
) -> None:
    """Attempt fence: one worker, frozen mid-attempt 1 until the reaper took the job, claims
    it again (attempt 2, its own worker id); then attempt 1 finishes and its outcome, under the
    same worker id, must change nothing while attempt 2 runs."""
    gate = tmp_path / "gate"
    job_id = _enqueue_gated(queue, gate)
    worker = workers.start("--concurrency", "2", *POLL, lease_seconds=LEASE)
    _started(backend, 1, worker)
    owner = _job(queue, job_id).locked_by
    assert owner is not None

    # No heartbeats: the lease runs out. Frozen between its transactions: frozen in one, it
    # would hold its locks (on SQLite the only write lock) and the reaper could never run.
    freeze_between_transactions(worker, backend.engine)
    try:
        wait_until(
            lambda: job_id in queue.store.reap_expired()[0],
            timeout=LEASE + 25,
            interval=0.2,
            what="the reaper to take the frozen worker's job",
            explain=worker.describe,
        )
    finally:
        worker.send(signal.SIGCONT)
    _started(backend, 2, worker)  # the same worker claimed it again, attempt 1 still running
    job = _job(queue, job_id)
    assert (job.status, job.attempts, job.locked_by) == ("running", 2, owner)

    _open(gate, 1)  # attempt 1 returns; the worker writes its outcome under its own id
    wait_until(
        lambda: (
            f"on job {job_id} (ledger.gated, attempt 1)" in worker.log()
            or _job(queue, job_id).status != "running"
        ),
        timeout=30,
        what="the worker to write attempt 1's outcome",
        explain=worker.describe,
    )
    job = _job(queue, job_id)
    assert (job.status, job.attempts, job.locked_by) == ("running", 2, owner), (
        "attempt 1's outcome must not land on attempt 2"
    )
    assert job.result is None

    _open(gate, 2)
    wait_until(
        lambda: _job(queue, job_id).status == "succeeded",
        timeout=30,
        what="attempt 2 to succeed",
        explain=worker.describe,
    )
    assert worker.stop() == 0, worker.describe()
    job = _job(queue, job_id)
    assert (job.attempts, job.result) == (2, {"attempt": 2, "pid": worker.pid})
    assert [(e.attempt, e.kind) for e in job.errors] == [(1, "LeaseExpired")]


def test_a_worker_cannot_finish_an_attempt_another_worker_now_holds(
    backend: Backend, queue: sqlqueue.Queue, workers: Workers, tmp_path: Path
) -> None:
    """Owner fence: the first worker stops and gives attempt 1 back (a release does not count
    the attempt), the second claims it as attempt 1 too. The first worker's late outcomes for
    attempt 1 — written here under its id and fence, since a stopped worker writes nothing
    more — match the row's status and attempt, and must change nothing all the same."""
    gate = tmp_path / "gate"
    job_id = _enqueue_gated(queue, gate)
    first = workers.start("--concurrency", "1", "--shutdown-timeout", "0.5", *POLL)
    _started(backend, 1, first)
    first_id = _job(queue, job_id).locked_by
    assert first_id is not None
    assert first.stop() == 0, first.describe()
    released = _job(queue, job_id)
    assert (released.status, released.attempts, released.locked_by) == ("queued", 0, None)

    second = workers.start("--concurrency", "1", *POLL)
    _started(backend, 1, second)
    held = _job(queue, job_id)
    assert (held.status, held.attempts) == ("running", 1)
    assert held.locked_by not in (None, first_id)

    store, fence = queue.store, (job_id, 1)
    dead = Failure(job_id=job_id, attempt=1, dead=True, retry_in=0, last_error="late", errors=[])
    assert store.finish(worker_id=first_id, succeeded=[fence], failures=[], results={}) == set()
    assert store.finish(worker_id=first_id, succeeded=[], failures=[dead]) == set()
    assert store.release(worker_id=first_id, fences=[fence]) == set()
    assert store.extend_leases(worker_id=first_id, fences=[fence], lease_seconds=3600) == {}
    job = _job(queue, job_id)
    assert (job.status, job.attempts, job.locked_by) == ("running", 1, held.locked_by)
    assert (job.lease_expires_at, job.last_error, job.errors) == (held.lease_expires_at, None, ())

    _open(gate, 1)
    wait_until(
        lambda: _job(queue, job_id).status == "succeeded",
        timeout=30,
        what="the second worker's attempt 1 to succeed",
        explain=second.describe,
    )
    assert second.stop() == 0, second.describe()
    job = _job(queue, job_id)
    assert (job.attempts, job.result) == (1, {"attempt": 1, "pid": second.pid})
