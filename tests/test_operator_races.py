"""Two operators acting on one job at the same instant: exactly one wins where the actions
exclude each other, and the other is told why with a ``JobStateError``; where they compose,
the job ends as one order of the two would leave it.

Before, a requeue and a discard of the same dead job both succeeded (13 of 20 rounds on
PostgreSQL, 17 of 20 on MariaDB): the row said "discarded: never run this" and the job ran
anyway. Threads start each pair together at a barrier, 50 rounds per pair, on the backends
with row locks (SQLite's one writer takes them one after the other: covered by the sequence
tests in ``tests/test_operations.py``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import sqlqueue
from sqlqueue.dialects import dialect_for
from tests._support import drain
from tests.conftest import Backend


def _job(queue: sqlqueue.Queue, job_id: int) -> sqlqueue.Job:
    """Job ``job_id``, which the test knows is there."""
    job = queue.get_job(job_id)
    assert job is not None, job_id
    return job


ROUNDS = 50

Action = Callable[[sqlqueue.Queue, int], Any]


def _requeue(queue: sqlqueue.Queue, job_id: int) -> Any:
    return queue.requeue(job_id, by="ada", reason="fixed")


def _discard(queue: sqlqueue.Queue, job_id: int) -> Any:
    return queue.discard(job_id, by="bob", reason="spam")


def _cancel(queue: sqlqueue.Queue, job_id: int) -> Any:
    return queue.cancel(job_id, by="cy", reason="withdrawn")


def _run_now(queue: sqlqueue.Queue, job_id: int) -> Any:
    return queue.run_now([job_id], by="dee", reason="customer waits")


def _reschedule(queue: sqlqueue.Queue, job_id: int) -> Any:
    later = datetime.now(UTC) + timedelta(days=1)
    return queue.reschedule(job_id, later, by="eve", reason="after deploy")


def _race(queue: sqlqueue.Queue, job_id: int, first: Action, second: Action) -> list[Any]:
    """Run ``first`` and ``second`` on ``job_id`` from two threads released together; each
    outcome is the action's return value or the exception it raised."""
    barrier = threading.Barrier(2)
    outcomes: list[Any] = [None, None]

    def run(slot: int, action: Action) -> None:
        barrier.wait(30)
        try:
            outcomes[slot] = action(queue, job_id)
        except Exception as error:  # handed to the test, which names what it expected
            outcomes[slot] = error

    threads = [threading.Thread(target=run, args=(n, a)) for n, a in enumerate((first, second))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return outcomes


@pytest.fixture
def queue(backend: Backend) -> sqlqueue.Queue:
    if not dialect_for(backend.engine).supports_row_locks:
        pytest.skip("SQLite's one writer runs the two actions one after the other")
    queue = backend.queue()

    @queue.task("boom", max_attempts=1)
    def boom(n: int) -> None:
        raise ValueError("no")

    @queue.task("later")
    def later(n: int) -> None:
        return None

    return queue


def _dead_jobs(backend: Backend, queue: sqlqueue.Queue, count: int) -> list[int]:
    with backend.engine.begin() as conn:
        ids = [queue.enqueue(conn, "boom", {"n": n}) for n in range(count)]
    drain(queue)
    return ids


EXCLUSIVE = {
    "requeue-discard": (_requeue, _discard),
    "requeue-requeue": (_requeue, _requeue),
    "discard-discard": (_discard, _discard),
}


@pytest.mark.parametrize("pair", list(EXCLUSIVE))
def test_two_actions_on_one_dead_job_at_once_exactly_one_wins(
    backend: Backend, queue: sqlqueue.Queue, pair: str
) -> None:
    first, second = EXCLUSIVE[pair]
    both: list[int] = []
    dead = _dead_jobs(backend, queue, ROUNDS)
    for job_id in dead:
        outcomes = _race(queue, job_id, first, second)
        lost = [o for o in outcomes if isinstance(o, Exception)]
        assert len(lost) == 1, outcomes
        assert isinstance(lost[0], sqlqueue.JobStateError), lost[0]
        assert "already requeued" in str(lost[0]) or "discarded by" in str(lost[0])
        job = _job(queue, job_id)
        if job.requeued_as is not None and job.discarded_at is not None:
            both.append(job_id)
    assert both == [], "requeued and discarded both"
    new_jobs = queue.stats().by_status.get("queued", 0)
    requeued = sum(_job(queue, job_id).requeued_as is not None for job_id in dead)
    assert new_jobs == requeued  # one new job per requeue that won, none for a loser


COMPOSING = {
    "cancel-reschedule": (_cancel, _reschedule),
    "cancel-run_now": (_cancel, _run_now),
    "reschedule-run_now": (_reschedule, _run_now),
}


@pytest.mark.parametrize("pair", list(COMPOSING))
def test_two_actions_on_one_waiting_job_at_once_end_as_one_order_would(
    backend: Backend, queue: sqlqueue.Queue, pair: str
) -> None:
    """A cancel that won leaves the job cancelled and the other action refused (a cancelled
    job is not rescheduled); one that came second cancels what the other changed."""
    first, second = COMPOSING[pair]
    with backend.engine.begin() as conn:
        ids = [queue.enqueue(conn, "later", {"n": n}, delay=3600) for n in range(ROUNDS)]
    for job_id in ids:
        outcomes = _race(queue, job_id, first, second)
        errors = [o for o in outcomes if isinstance(o, Exception)]
        assert all(isinstance(e, sqlqueue.JobStateError) for e in errors), errors
        job = _job(queue, job_id)
        if first is _cancel:
            assert not isinstance(outcomes[0], Exception), outcomes  # a waiting job cancels
            assert job.status == "cancelled"
        else:
            assert errors == [], outcomes
            assert job.status == "queued"
