"""Real worker processes on both backends: exactly-once draining, crash recovery, fencing of a
stalled worker, graceful shutdown and timeouts.

Workers are ``python -m sqlqueue worker tests.apps.ledger_app:queue`` children. Their handlers
append one row per execution to a ledger table (``tests/apps/ledger.py``), so every claim here
is counted from database rows, never from logs.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import sqlqueue
from tests._support.freezing import freeze_between_transactions
from tests.apps.ledger import create_ledger, read_ledger, register_ledger_tasks
from tests.apps.processes import Workers, wait_until
from tests.conftest import Backend

pytestmark = pytest.mark.timeout(120)

FAST_POLL = ("--poll-interval", "0.05")


@pytest.fixture
def queue(backend: Backend) -> sqlqueue.Queue:
    """A queue with the ledger tasks (to enqueue them) and an empty ledger table."""
    create_ledger(backend.engine)
    queue = backend.queue()
    register_ledger_tasks(queue)
    return queue


def ledger_job(job_type: str, key: str, **options: Any) -> sqlqueue.JobRequest:
    """A ledger job request whose idempotency key (and payload ``key``) is ``key``."""
    payload = {"key": key, **options.pop("payload", {})}
    return sqlqueue.JobRequest(job_type=job_type, payload=payload, idempotency_key=key, **options)


def enqueue_all(queue: sqlqueue.Queue, requests: list[sqlqueue.JobRequest]) -> list[int]:
    """Enqueue ``requests`` in one committed transaction."""
    with queue.engine.begin() as conn:
        return queue.enqueue_many(conn, requests)


def job_rows(engine: sa.Engine) -> dict[int, sa.RowMapping]:
    """Every job's id, status, attempts and lock owner, read straight from the table."""
    query = sa.text("SELECT id, status, attempts, locked_by, started_at FROM sqlqueue_jobs")
    with engine.connect() as conn:
        return {row["id"]: row for row in conn.execute(query).mappings()}


def count_status(engine: sa.Engine, status: str) -> int:
    """How many jobs are in ``status``."""
    query = sa.text("SELECT count(*) FROM sqlqueue_jobs WHERE status = :status")
    with engine.connect() as conn:
        return int(conn.execute(query, {"status": status}).scalar_one())


def report(capsys: pytest.CaptureFixture[str], line: str) -> None:
    """Print a measured figure even when pytest captures output."""
    with capsys.disabled():
        print(f"\n    {line}")


def require_job(queue: sqlqueue.Queue, job_id: int) -> sqlqueue.Job:
    """The job ``job_id``, which must exist."""
    job = queue.get_job(job_id)
    assert job is not None, f"job {job_id} vanished"
    return job


# -- 1. exactly once ---------------------------------------------------------------------------

#: Enough for every process to claim many rounds against the others (each takes ~200 jobs in
#: rounds of up to 8); the 2,000 it used before proved nothing more. Claim races under
#: load are tests/faults/test_claim_race.py's subject; bench/ measures the drain rate.
DRAIN_JOBS = 800
DRAIN_WORKERS = 4


def test_worker_processes_drain_every_job_exactly_once(
    backend: Backend, queue: sqlqueue.Queue, workers: Workers, capsys: pytest.CaptureFixture[str]
) -> None:
    pool = [workers.start("--concurrency", "4", *FAST_POLL) for _ in range(DRAIN_WORKERS)]
    for worker in pool:
        worker.wait_ready()

    enqueued_at = time.time()
    ids = enqueue_all(queue, [ledger_job("ledger.record", f"drain:{n}") for n in range(DRAIN_JOBS)])
    assert len(set(ids)) == DRAIN_JOBS

    wait_until(
        lambda: count_status(backend.engine, "succeeded") == DRAIN_JOBS,
        timeout=90,
        what=f"{DRAIN_JOBS} jobs to succeed",
        interval=0.2,
        explain=lambda: "\n".join(w.describe() for w in pool),
    )
    for worker in pool:
        assert worker.stop() == 0, worker.describe()

    jobs = job_rows(backend.engine)
    assert set(jobs) == set(ids)
    assert {(row["status"], row["attempts"]) for row in jobs.values()} == {("succeeded", 1)}

    ledger = read_ledger(backend.engine)
    runs = Counter(row.job_id for row in ledger)
    twice = sorted(job_id for job_id, count in runs.items() if count > 1)
    assert not twice, f"jobs that ran more than once: {twice[:20]}"
    assert set(runs) == set(ids), "every job ran, and only the jobs enqueued"
    assert len(ledger) == DRAIN_JOBS
    assert {row.attempt for row in ledger} == {1}
    by_pid = {pid: sum(row.pid == pid for row in ledger) for pid in {row.pid for row in ledger}}
    assert set(by_pid) <= {worker.pid for worker in pool}
    assert len(by_pid) == DRAIN_WORKERS, f"every worker process took jobs: {by_pid}"

    seconds = max(row.finished or 0.0 for row in ledger) - enqueued_at
    report(
        capsys,
        f"[{backend.name}] {DRAIN_JOBS} jobs drained by {DRAIN_WORKERS} worker processes "
        f"(concurrency 4 each) in {seconds:.2f} s: {DRAIN_JOBS / seconds:,.0f} jobs/s; "
        f"jobs per process {sorted(by_pid.values())}",
    )


# -- 2. a worker killed or stalled mid-job -----------------------------------------------------

CRASH_LEASE = 2.0
#: How often the worker that takes over reaps. It keeps the app's 30 s lease itself: on a
#: loaded machine a late heartbeat would otherwise let it reap its own attempt too (attempt 3).
CRASH_REAPER_INTERVAL = max(CRASH_LEASE / 2, 0.5)
CRASHED_JOBS = 3


def test_jobs_of_a_killed_worker_complete_on_another(
    backend: Backend, queue: sqlqueue.Queue, workers: Workers, capsys: pytest.CaptureFixture[str]
) -> None:
    # Attempt 1 would sleep a minute; any later attempt 0.2 s.
    ids = enqueue_all(
        queue,
        [
            ledger_job("ledger.sleep", f"crash:{n}", payload={"seconds": 0.2, "first_seconds": 60})
            for n in range(CRASHED_JOBS)
        ],
    )
    doomed = workers.start("--concurrency", "4", *FAST_POLL, lease_seconds=CRASH_LEASE)
    wait_until(
        lambda: len(read_ledger(backend.engine)) == CRASHED_JOBS,
        timeout=30,
        what="the doomed worker to start every job",
        explain=doomed.describe,
    )

    doomed.send(signal.SIGKILL)
    assert doomed.wait(timeout=10) == -signal.SIGKILL
    killed_at = time.time()
    rescuer = workers.start("--concurrency", "4", *FAST_POLL, reaper_interval=CRASH_REAPER_INTERVAL)

    deadline = CRASH_LEASE + CRASH_REAPER_INTERVAL + 5.0
    wait_until(
        lambda: count_status(backend.engine, "succeeded") == CRASHED_JOBS,
        timeout=deadline + 20,
        what="the crashed jobs to complete on the second worker",
        explain=rescuer.describe,
    )
    ledger = read_ledger(backend.engine)
    recovered_in = max(row.finished or 0.0 for row in ledger) - killed_at
    report(
        capsys,
        f"[{backend.name}] {CRASHED_JOBS} jobs of a SIGKILLed worker completed on another "
        f"{recovered_in:.2f} s after the kill (lease {CRASH_LEASE:g} s, reaper every "
        f"{CRASH_REAPER_INTERVAL:g} s, including the new worker's start-up)",
    )
    # How fast is a figure (bench/ measures it): the wait above already failed the test if the
    # jobs had not completed within the lease, the reaper interval and a loaded machine's margin.
    assert rescuer.stop() == 0, rescuer.describe()

    for job_id in ids:
        job = require_job(queue, job_id)
        assert job.status == sqlqueue.JobStatus.SUCCEEDED
        assert job.attempts == 2
        assert [(e.attempt, e.kind) for e in job.errors] == [(1, "LeaseExpired")]
        assert "lease expired" in job.errors[0].error
        assert str(doomed.pid) in job.errors[0].error, "the error names the worker that died"
        runs = [
            (row.attempt, row.pid, row.finished is not None)
            for row in ledger
            if row.job_id == job_id
        ]
        assert runs == [(1, doomed.pid, False), (2, rescuer.pid, True)]


def test_a_stalled_worker_cannot_overwrite_its_successors_attempt(
    backend: Backend, queue: sqlqueue.Queue, workers: Workers, tmp_path: Path
) -> None:
    # Each attempt runs until the test creates its gate file, so the stalled attempt 1 wakes
    # up while attempt 2 still runs, however slow the machine is.
    gate = tmp_path / "stall-gate"
    (job_id,) = enqueue_all(
        queue, [ledger_job("ledger.gated", "stall", payload={"gate": str(gate)})]
    )
    stalled = workers.start("--concurrency", "2", *FAST_POLL, lease_seconds=CRASH_LEASE)
    wait_until(
        lambda: read_ledger(backend.engine),
        timeout=30,
        what="the first attempt to start",
        explain=stalled.describe,
    )
    # Inside attempt 1's handler, and between two of the worker's transactions: frozen in one,
    # it would hold its locks (on SQLite the only write lock) for as long as it stays frozen.
    freeze_between_transactions(stalled, backend.engine)  # no heartbeats, no outcome
    try:
        successor = workers.start(
            "--concurrency", "2", *FAST_POLL, reaper_interval=CRASH_REAPER_INTERVAL
        )
        wait_until(
            lambda: len(read_ledger(backend.engine)) == 2,
            timeout=CRASH_LEASE + CRASH_REAPER_INTERVAL + 25,
            what="the successor to start attempt 2",
            explain=successor.describe,
        )
    finally:
        gate.with_suffix(".1").touch()
        stalled.send(signal.SIGCONT)
    # The stalled worker wakes up, finishes its long-lost attempt 1 and tries to record it;
    # a graceful stop makes it write every pending outcome before it exits.
    wait_until(
        lambda: read_ledger(backend.engine)[0].finished,
        timeout=30,
        what="the stalled attempt to finish its handler",
        explain=stalled.describe,
    )
    assert stalled.stop() == 0, stalled.describe()
    job = require_job(queue, job_id)
    assert (job.status, job.attempts) == (sqlqueue.JobStatus.RUNNING, 2), "attempt 2 still runs"
    assert job.locked_by is not None
    assert f":{successor.pid}:" in job.locked_by

    gate.with_suffix(".2").touch()
    wait_until(
        lambda: count_status(backend.engine, "succeeded") == 1,
        timeout=30,
        what="attempt 2 to succeed",
        explain=successor.describe,
    )
    assert successor.stop() == 0, successor.describe()
    job = require_job(queue, job_id)
    assert (job.status, job.attempts) == (sqlqueue.JobStatus.SUCCEEDED, 2)
    assert job.result == {"attempt": 2, "pid": successor.pid}, "attempt 2's outcome stands"
    assert [(e.attempt, e.kind) for e in job.errors] == [(1, "LeaseExpired")]
    runs = [(row.attempt, row.pid, row.finished is not None) for row in read_ledger(backend.engine)]
    assert runs == [(1, stalled.pid, True), (2, successor.pid, True)]


# -- 3. graceful shutdown ----------------------------------------------------------------------

SHUTDOWN_TIMEOUT = 3.0
SHORT_JOB = 1.5
#: The in-flight job no test here waits out: an hour, far past any deadline of the test.
NEVER_ENDING_JOB = 3600.0


@pytest.mark.interrupts_handler_threads
def test_sigterm_lets_short_jobs_finish_and_releases_the_long_one(
    backend: Backend,
    queue: sqlqueue.Queue,
    workers: Workers,
    capsys: pytest.CaptureFixture[str],
) -> None:
    in_flight = [
        ledger_job("ledger.sleep", f"short:{n}", payload={"seconds": SHORT_JOB}) for n in range(3)
    ] + [ledger_job("ledger.sleep", "long", payload={"seconds": NEVER_ENDING_JOB})]
    # Less urgent jobs that are due the whole time: a worker still claiming would take them.
    backlog = [ledger_job("ledger.record", f"backlog:{n}", priority=5) for n in range(4)]
    ids = enqueue_all(queue, in_flight + backlog)
    short_ids, long_id, backlog_ids = ids[:3], ids[3], ids[4:]

    worker = workers.start(
        "--concurrency", "4", "--shutdown-timeout", str(SHUTDOWN_TIMEOUT), *FAST_POLL
    )
    wait_until(
        lambda: len(read_ledger(backend.engine)) == 4,
        timeout=30,
        what="the four in-flight jobs to start",
        explain=worker.describe,
    )
    signalled_at = time.time()
    worker.send(signal.SIGTERM)
    status = worker.wait(timeout=SHUTDOWN_TIMEOUT + 15)
    took = time.time() - signalled_at
    assert status == 0, worker.describe()
    report(
        capsys,
        f"[{backend.name}] SIGTERM to exit with a long job in flight: {took:.2f} s "
        f"(shutdown timeout {SHUTDOWN_TIMEOUT:g} s)",
    )
    # It waited out the grace for the long job (and no longer than the job: an hour).
    assert took >= SHUTDOWN_TIMEOUT - 0.5, took

    ledger = {row.job_id: row for row in read_ledger(backend.engine)}
    assert set(ledger) == {*short_ids, long_id}, "no backlog job ever started"
    assert all(row.started < signalled_at for row in ledger.values()), "no start after SIGTERM"
    for job_id in short_ids:
        finished = ledger[job_id].finished
        assert finished is not None, "the short jobs finished"
        assert finished > signalled_at, "…after the signal: they were in flight when it came"
        job = require_job(queue, job_id)
        assert (job.status, job.attempts) == (sqlqueue.JobStatus.SUCCEEDED, 1)
    assert ledger[long_id].finished is None

    long_job = require_job(queue, long_id)
    assert long_job.status == sqlqueue.JobStatus.QUEUED
    assert long_job.attempts == 0, "released without burning an attempt"
    assert long_job.locked_by is None
    assert long_job.lease_expires_at is None
    assert long_job.errors == ()
    # Three slots freed after the signal while four due jobs waited: none was claimed.
    for job_id in backlog_ids:
        job = require_job(queue, job_id)
        assert (job.status, job.attempts, job.started_at) == (sqlqueue.JobStatus.QUEUED, 0, None)


#: The in-flight job of the second-SIGTERM test, and the grace it is given: an hour, so a
#: worker that waited for either could not exit while the test runs.
LONG_JOB = NEVER_ENDING_JOB


@pytest.mark.interrupts_handler_threads
def test_a_second_sigterm_releases_in_flight_jobs_at_once(
    backend: Backend, queue: sqlqueue.Queue, workers: Workers
) -> None:
    (long_id,) = enqueue_all(
        queue, [ledger_job("ledger.sleep", "long", payload={"seconds": LONG_JOB})]
    )
    worker = workers.start("--concurrency", "2", "--shutdown-timeout", str(LONG_JOB), *FAST_POLL)
    wait_until(
        lambda: read_ledger(backend.engine),
        timeout=30,
        what="the long job to start",
        explain=worker.describe,
    )
    worker.send(signal.SIGTERM)
    wait_until(
        lambda: "received SIGTERM: no new claims" in worker.log(),
        timeout=30,
        what="the worker to take the first SIGTERM",
        explain=worker.describe,
    )
    assert worker.popen.poll() is None, "the first SIGTERM waits for the in-flight job"

    worker.send(signal.SIGTERM)
    # Waiting would take the job's hour (and the hour's grace): an exit at all is "did not
    # wait", and the job's unfinished run below says it was cut, not waited for.
    status = worker.wait(timeout=45)
    assert status == 0, worker.describe()

    long_job = require_job(queue, long_id)
    assert (long_job.status, long_job.attempts) == (sqlqueue.JobStatus.QUEUED, 0)
    assert long_job.locked_by is None
    assert [row.finished for row in read_ledger(backend.engine)] == [None]


# -- 4. timeouts -------------------------------------------------------------------------------


@pytest.mark.interrupts_handler_threads
def test_timeouts_fail_the_attempt_and_free_the_slot(
    backend: Backend,
    queue: sqlqueue.Queue,
    workers: Workers,
    capsys: pytest.CaptureFixture[str],
) -> None:
    timed = [
        ledger_job("ledger.timed_spin", "spin", max_attempts=2),
        ledger_job(
            "ledger.timed_sleep", "sleep", max_attempts=2, payload={"seconds": NEVER_ENDING_JOB}
        ),
        ledger_job("ledger.timed_await", "await", max_attempts=2),
        # Times out on attempt 1, then returns at once: a timeout is retried. Its ledger writes
        # count against its timeout too: on a loaded machine a later attempt may time out as
        # well (a write took over 0.5 s), so what is asserted is the order, not the count.
        ledger_job(
            "ledger.timed_sleep",
            "recovers",
            max_attempts=5,
            payload={"seconds": NEVER_ENDING_JOB, "later_seconds": 0},
        ),
    ]
    after = [ledger_job("ledger.record", f"after:{n}", priority=1) for n in range(3)]
    ids = enqueue_all(queue, timed + after)
    spin_id, sleep_id, await_id, recovers_id = ids[:4]
    after_ids = ids[4:]

    began = time.time()
    worker = workers.start("--concurrency", "1", "--burst", *FAST_POLL)
    # 7 timed-out attempts of 0.5 s each on one slot; a leaked slot would wait for an hour's
    # sleep, so the burst worker ends at all only if every timeout freed its slot.
    assert worker.wait(timeout=60) == 0, worker.describe()
    took = time.time() - began
    report(capsys, f"[{backend.name}] 7 timed-out attempts on one slot drained in {took:.1f} s")
    # An interrupted handler's late JobTimeout is nobody's business: no stray tracebacks.
    assert "Traceback" not in worker.log(), worker.describe()

    for job_id in (spin_id, sleep_id, await_id):
        job = require_job(queue, job_id)
        assert (job.status, job.attempts) == (sqlqueue.JobStatus.DEAD, 2), job
        assert [(e.attempt, e.kind) for e in job.errors] == [(1, "JobTimeout"), (2, "JobTimeout")]
        assert job.last_error is not None
        assert job.last_error.startswith("JobTimeout: ")
        assert "timeout of 0.5 s" in job.last_error
    recovered = require_job(queue, recovers_id)
    assert recovered.status == sqlqueue.JobStatus.SUCCEEDED, recovered
    assert recovered.attempts >= 2, recovered
    timed_out = [(n, "JobTimeout") for n in range(1, recovered.attempts)]
    assert [(e.attempt, e.kind) for e in recovered.errors] == timed_out
    for job_id in after_ids:
        job = require_job(queue, job_id)
        assert (job.status, job.attempts) == (sqlqueue.JobStatus.SUCCEEDED, 1)

    ledger = read_ledger(backend.engine)
    runs = {job_id: [row.attempt for row in ledger if row.job_id == job_id] for job_id in ids}
    assert runs == {
        spin_id: [1, 2],
        sleep_id: [1, 2],
        await_id: [1, 2],
        recovers_id: list(range(1, recovered.attempts + 1)),
        **{job_id: [1] for job_id in after_ids},
    }
    last_timed_start = max(row.started for row in ledger if row.job_id not in after_ids)
    assert all(row.started > last_timed_start for row in ledger if row.job_id in after_ids)
