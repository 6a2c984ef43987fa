"""The claim floor: where a dialect supports it, a worker's claims start past the jobs it claimed
before, so dead row versions at the head of the claim index are not walked; a claim without
the floor, at least every ``FLOOR_RESET_SECONDS``, finds what sorts before it."""

from __future__ import annotations

import pytest

from sqlqueue._store.claim_floor import FLOOR_RESET_SECONDS, ClaimFloors


class _Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _claim(queue, worker_id="w", limit=1):
    claimed = queue.store.claim(
        queues=["default"], job_types=None, limit=limit, worker_id=worker_id, lease_seconds=30
    )
    return [job.id for job in claimed]


def _enqueue(backend, queue, priority):
    with backend.engine.begin() as conn:
        return queue.enqueue(conn, "t", {}, priority=priority, external=True)


def test_a_job_before_the_floor_waits_for_the_next_claim_without_one(backend):
    backend.requires("claim_floor")
    queue = backend.queue()
    clock = _Clock()
    queue.store.claim_floors = ClaimFloors(clock=clock)
    first = _enqueue(backend, queue, priority=5)
    assert _claim(queue) == [first]  # no floor yet: from the head of the index
    urgent = _enqueue(backend, queue, priority=0)  # sorts before the floor (priority 5)
    later = _enqueue(backend, queue, priority=5)
    assert _claim(queue) == [later]
    clock.now += FLOOR_RESET_SECONDS
    assert _claim(queue) == [urgent]


def test_without_a_floor_every_claim_takes_the_most_urgent_job(backend):
    if backend.capable("claim_floor"):
        pytest.skip(f"{backend.name} claims with a floor")
    queue = backend.queue()
    first = _enqueue(backend, queue, priority=5)
    assert _claim(queue) == [first]
    urgent = _enqueue(backend, queue, priority=0)
    _enqueue(backend, queue, priority=5)
    assert _claim(queue) == [urgent]


def test_each_worker_keeps_its_own_floor(backend):
    backend.requires("claim_floor")
    queue = backend.queue()
    queue.store.claim_floors = ClaimFloors(clock=_Clock())
    first = _enqueue(backend, queue, priority=5)
    assert _claim(queue, worker_id="a") == [first]
    urgent = _enqueue(backend, queue, priority=0)
    assert _claim(queue, worker_id="b") == [urgent]  # b has no floor: the head of the index


def test_a_claim_without_a_floor_that_finds_nothing_clears_it(backend):
    backend.requires("claim_floor")
    queue = backend.queue()
    clock = _Clock()
    queue.store.claim_floors = ClaimFloors(clock=clock)
    first = _enqueue(backend, queue, priority=5)
    assert _claim(queue) == [first]
    clock.now += FLOOR_RESET_SECONDS
    assert _claim(queue) == []  # without the floor: nothing is claimable, the floor goes
    urgent = _enqueue(backend, queue, priority=0)
    assert _claim(queue) == [urgent]


def test_a_burst_worker_runs_a_job_that_sorts_before_its_floor_before_it_exits(backend):
    queue = backend.queue()
    ran: list[str] = []

    @queue.task("urgent")
    def urgent() -> None:
        ran.append("urgent")

    @queue.task("slow")
    def slow() -> None:
        # Enqueued while this job runs: more urgent than the worker's floor (priority 5).
        with backend.engine.begin() as conn:
            queue.enqueue(conn, "urgent", {}, priority=0)
        ran.append("slow")

    with backend.engine.begin() as conn:
        queue.enqueue(conn, "slow", {}, priority=5)
    queue.worker(concurrency=1, poll_interval=0.05).run(burst=True)
    assert ran == ["slow", "urgent"]
