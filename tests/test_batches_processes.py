"""Batches with real worker processes: the callback is enqueued exactly once however the children
end and wherever they run — spread over three workers, one of them SIGKILLed mid-batch; with
dead children (``on_dead``); with the last two children ending at the same moment on two
workers; with an operator cancelling children while workers end others; and with children a
running child added.

Workers are ``python -m sqlqueue worker tests.apps.batch_app:queue`` children. Every count here
comes from database rows: sqlqueue's jobs and batches, and the handlers' own tables.
"""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import sqlqueue
from sqlqueue import JobRequest
from sqlqueue._schema import jobs
from tests.apps.batch_app import CALLBACKS, RUNS, create_tables, register_batch_tasks
from tests.apps.processes import WorkerProcess, Workers, wait_until
from tests.conftest import Backend

pytestmark = pytest.mark.timeout(240)

APP = "tests.apps.batch_app:queue"
FAST_POLL = ("--poll-interval", "0.05")
#: The crash test's lease: the killed worker's jobs go back to the others once it expires.
CRASH_LEASE = 2.0

DONE = JobRequest(job_type="batch.done")
FAILED = JobRequest(job_type="batch.failed")


@pytest.fixture
def queue(backend: Backend) -> sqlqueue.Queue:
    """A queue with the batch tasks (to enqueue them) and the handlers' tables."""
    create_tables(backend.engine)
    queue = backend.queue()
    register_batch_tasks(queue)
    return queue


def _enqueue_batch(queue: sqlqueue.Queue, requests: list[JobRequest], **options: Any) -> Any:
    with queue.engine.begin() as conn:
        return queue.enqueue_batch(conn, requests, **options)


def _callbacks(engine: sa.Engine) -> list[sa.RowMapping]:
    """What each callback execution saw, oldest first."""
    with engine.connect() as conn:
        return list(conn.execute(sa.select(CALLBACKS).order_by(CALLBACKS.c.id)).mappings())


def _callback_jobs(engine: sa.Engine, batch_id: int) -> list[sa.RowMapping]:
    """The callback jobs of ``batch_id``: jobs of the batch that are not its children."""
    query = sa.select(jobs.c.id, jobs.c.job_type, jobs.c.status).where(
        jobs.c.batch_id == batch_id, jobs.c.job_type.in_(("batch.done", "batch.failed"))
    )
    with engine.connect() as conn:
        return list(conn.execute(query).mappings())


def _statuses(engine: sa.Engine, ids: tuple[int, ...]) -> Counter[str]:
    with engine.connect() as conn:
        rows = conn.execute(sa.select(jobs.c.status).where(jobs.c.id.in_(ids))).scalars()
        return Counter(rows)


def _runs_by_pid(engine: sa.Engine) -> Counter[int]:
    with engine.connect() as conn:
        return Counter(conn.execute(sa.select(RUNS.c.pid)).scalars())


def _finished(queue: sqlqueue.Queue, batch_id: int) -> bool:
    status = queue.get_batch(batch_id)
    return status is not None and status.finished


def _called_back(engine: sa.Engine, count: int) -> bool:
    return len(_callbacks(engine)) >= count


def _explain(pool: list[WorkerProcess]) -> Any:
    return lambda: "\n".join(worker.describe() for worker in pool)


def _ready_pool(
    workers: Workers, count: int, *options: str, lease_seconds: float | None = None
) -> list[WorkerProcess]:
    """``count`` worker processes started together, each serving before the test goes on: a
    SIGTERM that reaches a worker still importing would kill it before its handler is in
    place (exit -15, not the graceful 0 the tests check)."""
    pool = [
        workers.start(*options, *FAST_POLL, app=APP, lease_seconds=lease_seconds)
        for _ in range(count)
    ]
    for worker in pool:
        worker.wait_ready()
    return pool


def test_200_children_over_3_workers_one_killed_mid_batch_call_back_once(
    backend: Backend, queue: sqlqueue.Queue, workers: Workers
) -> None:
    requests = [
        JobRequest(job_type="batch.child", payload={"n": n, "seconds": 0.3}) for n in range(200)
    ]
    batch = _enqueue_batch(queue, requests, on_complete=DONE, on_dead=FAILED)
    pool = _ready_pool(workers, 3, "--concurrency", "4", lease_seconds=CRASH_LEASE)
    doomed = pool[0]
    # Kill one worker mid-batch: once it has run some children, while most are still to run.
    wait_until(
        lambda: _runs_by_pid(queue.engine)[doomed.pid] >= 10,
        timeout=120,
        what="the doomed worker to run 10 children",
        explain=_explain(pool),
    )
    doomed.send(signal.SIGKILL)
    assert doomed.wait(timeout=10) == -signal.SIGKILL
    killed_at = queue.get_batch(batch.id)
    assert killed_at is not None
    assert not killed_at.finished, "the batch finished before the kill: make children slower"

    wait_until(
        lambda: _called_back(queue.engine, 1),
        timeout=180,
        what="the batch's callback",
        explain=_explain(pool[1:]),
    )
    status = queue.get_batch(batch.id)
    assert status is not None
    assert status.finished
    assert dict(_statuses(queue.engine, batch.job_ids)) == {"succeeded": 200}
    assert (status.total, status.succeeded, status.dead, status.cancelled) == (200, 200, 0, 0)
    assert status.pending == 0
    (callback_job,) = _callback_jobs(queue.engine, batch.id)
    assert callback_job["id"] == status.callback_job_id
    assert callback_job["job_type"] == "batch.done"
    wait_until(
        lambda: _callback_jobs(queue.engine, batch.id)[0]["status"] == "succeeded",
        timeout=30,
        what="the callback to complete",
    )
    (seen,) = _callbacks(queue.engine)
    assert (seen["batch_id"], seen["total"], seen["succeeded"]) == (batch.id, 200, 200)
    assert (seen["dead"], seen["cancelled"], seen["pending"]) == (0, 0, 0)
    runs = _runs_by_pid(queue.engine)
    assert sum(runs.values()) >= 200
    assert len(runs) == 3, f"all three workers ran children: {runs}"
    # The killed worker's unfinished children ran again elsewhere (its in-flight attempts).
    with queue.engine.connect() as conn:
        retried = conn.execute(
            sa.select(sa.func.count()).select_from(jobs).where(jobs.c.id.in_(batch.job_ids),
                                                               jobs.c.attempts > 1)
        ).scalar_one()  # fmt: skip
    assert retried >= 1, "no child of the killed worker was recovered by the reaper"
    # Staying up a little longer changes nothing: no second callback.
    for worker in pool[1:]:
        assert worker.stop() == 0
    assert len(_callbacks(queue.engine)) == 1
    assert len(_callback_jobs(queue.engine, batch.id)) == 1


def test_children_that_die_send_the_batch_to_on_dead_once(
    backend: Backend, queue: sqlqueue.Queue, workers: Workers
) -> None:
    requests = [
        *(JobRequest(job_type="batch.child", payload={"n": n, "seconds": 0.01}) for n in range(40)),
        *(JobRequest(job_type="batch.doomed", payload={"n": n}) for n in range(5)),
    ]
    batch = _enqueue_batch(queue, requests, on_complete=DONE, on_dead=FAILED)
    pool = _ready_pool(workers, 3, "--concurrency", "4")
    wait_until(
        lambda: _called_back(queue.engine, 1),
        timeout=120,
        what="the batch's callback",
        explain=_explain(pool),
    )
    for worker in pool:
        assert worker.stop() == 0
    (seen,) = _callbacks(queue.engine)
    assert seen["job_type"] == "batch.failed"
    assert (seen["total"], seen["succeeded"], seen["dead"]) == (45, 40, 5)
    assert [row["job_type"] for row in _callback_jobs(queue.engine, batch.id)] == ["batch.failed"]


def test_the_last_two_children_ending_together_on_two_workers_call_back_once(
    backend: Backend, queue: sqlqueue.Queue, workers: Workers, tmp_path: Path
) -> None:
    """Each round is a batch of two children, one on each of two single-slot workers, held
    until both run and then released by one file: their outcomes race for the batch."""
    pool = _ready_pool(workers, 2, "--concurrency", "1")
    rounds = 5
    batch_ids = []
    for round_ in range(rounds):
        gate = tmp_path / f"gate-{round_}"
        requests = [
            JobRequest(job_type="batch.gated", payload={"n": n, "gate": str(gate)})
            for n in range(2)
        ]
        batch = _enqueue_batch(queue, requests, on_complete=DONE)
        batch_ids.append(batch.id)

        def both_running(ids: tuple[int, ...] = batch.job_ids) -> bool:
            query = sa.select(jobs.c.locked_by).where(
                jobs.c.id.in_(ids), jobs.c.status == "running"
            )
            with queue.engine.connect() as conn:
                return len(set(conn.execute(query).scalars())) == 2

        wait_until(both_running, timeout=60, what="both children to run", explain=_explain(pool))
        gate.touch()

        def called_back(count: int = round_ + 1) -> bool:
            return _called_back(queue.engine, count)

        wait_until(
            called_back,
            timeout=60,
            what=f"round {round_}'s callback",
            explain=_explain(pool),
        )
    for worker in pool:
        assert worker.stop() == 0
    seen = _callbacks(queue.engine)
    assert [row["batch_id"] for row in seen] == batch_ids
    assert all((row["total"], row["succeeded"]) == (2, 2) for row in seen)
    for batch_id in batch_ids:
        assert len(_callback_jobs(queue.engine, batch_id)) == 1
    pids = {row.pid for row in _all_runs(queue.engine)}
    assert pids == {worker.pid for worker in pool}


def _all_runs(engine: sa.Engine) -> list[sa.Row[Any]]:
    with engine.connect() as conn:
        return list(conn.execute(sa.select(RUNS)).all())


def test_children_added_by_running_children_delay_the_callback(
    backend: Backend, queue: sqlqueue.Queue, workers: Workers
) -> None:
    requests = [JobRequest(job_type="batch.fan", payload={"parts": 5}) for _ in range(4)]
    batch = _enqueue_batch(queue, requests, on_complete=DONE)
    pool = _ready_pool(workers, 2, "--concurrency", "4")
    wait_until(
        lambda: _called_back(queue.engine, 1),
        timeout=120,
        what="the batch's callback",
        explain=_explain(pool),
    )
    for worker in pool:
        assert worker.stop() == 0
    (seen,) = _callbacks(queue.engine)
    assert (seen["total"], seen["succeeded"], seen["pending"]) == (24, 24, 0)
    with queue.engine.connect() as conn:
        added = conn.execute(
            sa.select(sa.func.count()).select_from(jobs).where(
                jobs.c.batch_id == batch.id, jobs.c.job_type == "batch.child",
                jobs.c.status == "succeeded")
        ).scalar_one()  # fmt: skip
    assert added == 20
    assert len(_callback_jobs(queue.engine, batch.id)) == 1


def test_an_operator_cancelling_children_while_workers_finish_others_calls_back_once(
    backend: Backend, queue: sqlqueue.Queue, workers: Workers
) -> None:
    """``cancel_where`` ends the waiting children in the operator's transaction while the
    workers' outcome rounds end running ones: both count in the batch, one callback."""
    # Enough children that some are still queued when the operator acts, however many the
    # workers hold (claimed ahead of a free slot) by then.
    requests = [
        JobRequest(job_type="batch.child", payload={"n": n, "seconds": 0.2}) for n in range(200)
    ]
    batch = _enqueue_batch(queue, requests, on_complete=DONE, on_dead=FAILED)
    pool = _ready_pool(workers, 2, "--concurrency", "3")
    wait_until(
        lambda: sum(_runs_by_pid(queue.engine).values()) >= 10,
        timeout=120,
        what="10 children to run",
        explain=_explain(pool),
    )
    cancelled = queue.cancel_where(job_type="batch.child")
    assert cancelled > 0
    wait_until(
        lambda: _called_back(queue.engine, 1),
        timeout=120,
        what="the batch's callback",
        explain=_explain(pool),
    )
    for worker in pool:
        assert worker.stop() == 0
    statuses = _statuses(queue.engine, batch.job_ids)
    assert set(statuses) <= {"succeeded", "cancelled"}
    assert statuses["cancelled"] == cancelled
    (seen,) = _callbacks(queue.engine)
    assert seen["job_type"] == "batch.done"
    assert (seen["total"], seen["pending"]) == (200, 0)
    assert (seen["succeeded"], seen["cancelled"]) == (statuses["succeeded"], cancelled)
    assert len(_callback_jobs(queue.engine, batch.id)) == 1
