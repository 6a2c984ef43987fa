"""The claim floor: where a dialect supports it, a worker's claims start past the jobs it claimed
before, so dead row versions at the head of the claim index are not walked; the worker's floor
probe, every ``FLOOR_RESET_SECONDS`` beside the claims, finds what sorts before it (a claim
without the floor does when no look covered it for that long, twice that after a probe)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest

import sqlqueue
from sqlqueue import JobRequest, Workflow
from sqlqueue._store.claim_floor import (
    FLOOR_RESET_SECONDS,
    ClaimFloor,
    ClaimFloors,
    FloorKey,
    Released,
)
from sqlqueue._store.rows import ClaimedJob
from sqlqueue._worker import floor_probe
from tests._support import WorkerThread, wait_until
from tests._support.statements import is_claim, statements


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


def test_a_probe_finds_a_job_before_the_floor_and_spares_the_claims_their_own_look(backend):
    backend.requires("claim_floor")
    queue = backend.queue()
    clock = _Clock()
    queue.store.claim_floors = ClaimFloors(clock=clock)
    first = _enqueue(backend, queue, priority=5)
    assert _claim(queue) == [first]
    clock.now += FLOOR_RESET_SECONDS - 1
    queue.store.claim_floors.probe_started()  # as a worker's probe does
    assert queue.store.probe_claim_floors() == 0  # nothing before the floor yet
    urgent = _enqueue(backend, queue, priority=0)
    later = _enqueue(backend, queue, priority=5)
    clock.now += 1  # the claim looked FLOOR_RESET_SECONDS ago, the probe 1 s ago
    assert _claim(queue) == [later]  # still from the floor: no walk on the claim path
    assert queue.store.probe_claim_floors() == 1  # the floor goes down to the urgent job
    assert _claim(queue) == [urgent]


def test_claims_look_before_the_floor_themselves_when_the_probe_stops(backend):
    backend.requires("claim_floor")
    queue = backend.queue()
    clock = _Clock()
    queue.store.claim_floors = ClaimFloors(clock=clock)
    first = _enqueue(backend, queue, priority=5)
    assert _claim(queue) == [first]
    queue.store.claim_floors.probe_started()
    assert queue.store.probe_claim_floors() == 0
    urgent = _enqueue(backend, queue, priority=0)
    later = _enqueue(backend, queue, priority=5)
    clock.now += 2 * FLOOR_RESET_SECONDS - 0.5
    assert _claim(queue) == [later]
    clock.now += 0.5  # no probe for 2 * FLOOR_RESET_SECONDS: the claim looks itself
    assert _claim(queue) == [urgent]


def test_a_worker_runs_a_job_that_sorts_before_its_floor_within_a_probe_period(backend):
    """A job that sorts before a worker's floor is found by the probe, not by a claim's own
    look: after its first claim no claim of the worker runs without its floor. How long it
    waited is printed, not bounded: the probe's period (FLOOR_RESET_SECONDS, +10 %) is what a
    loaded machine stretches; the floors' rules are tested above on an injected clock."""
    backend.requires("claim_floor")
    queue = backend.queue()
    ran: dict[str, float] = {}

    @queue.task("job")
    def job(name: str) -> None:
        ran[name] = time.monotonic()

    with backend.engine.begin() as conn:
        queue.enqueue(conn, "job", {"name": "first"}, priority=5)
    worker = queue.worker(concurrency=1, poll_interval=0.05)
    with statements(queue.engine) as sent, WorkerThread(worker):
        wait_until(lambda: "first" in ran, what="the first job to run")
        with backend.engine.begin() as conn:
            queue.enqueue(conn, "job", {"name": "urgent"}, priority=0)  # before the floor (5)
        enqueued = time.monotonic()
        wait_until(lambda: "urgent" in ran, timeout=30, what="the urgent job to run")
    waited = ran["urgent"] - enqueued
    print(
        f"\n    [{backend.name}] a job before the claim floor ran {waited:.2f} s after its "
        f"enqueue (probe every {FLOOR_RESET_SECONDS:g} s)"
    )
    claims = [sql for sql in sent.sql if is_claim(sql)]
    without_floor = [sql for sql in claims if "floor_priority" not in sql]
    assert len(claims) > len(without_floor) == 1  # the first claim only: the probe looked


def test_a_probe_with_no_floor_to_look_before_sends_nothing(backend):
    backend.requires("claim_floor")
    queue = backend.queue()
    with statements(queue.engine) as sent:
        assert queue.store.probe_claim_floors() == 0  # a worker that has not claimed yet
    assert sent.sql == []


@pytest.mark.parametrize("completion", ["round", "transaction"])
def test_a_step_its_worker_releases_before_its_floor_runs_without_waiting_for_a_probe(
    backend, monkeypatch, completion
):
    """A workflow step more urgent than the worker's floor, released by the worker's own
    completion of its upstream (in the worker's round, or in the handler's transaction),
    lowers the worker's floor at once: its next claim takes it. Before, it waited for the next
    probe (up to FLOOR_RESET_SECONDS); here no probe or claim's own look comes in time (the
    probe runs every 10 minutes and the floors' clock stands still)."""
    backend.requires("claim_floor")
    monkeypatch.setattr(floor_probe, "FLOOR_RESET_SECONDS", 600.0)
    queue = backend.queue()
    queue.store.claim_floors = ClaimFloors(clock=_Clock())
    ran: list[str] = []

    @queue.task("job")
    def job(name: str, ctx: sqlqueue.JobContext) -> None:
        if completion == "transaction":
            with ctx.transaction():
                pass
        ran.append(name)

    wf = Workflow()
    wf.add("gate", JobRequest(job_type="job", payload={"name": "gate"}, priority=5))
    wf.add(
        "urgent", JobRequest(job_type="job", payload={"name": "urgent"}, priority=0),
        after=["gate"],
    )  # fmt: skip
    with WorkerThread(queue.worker(concurrency=1, poll_interval=0.05)):
        with backend.engine.begin() as conn:
            queue.enqueue_workflow(conn, wf)
        wait_until(lambda: "urgent" in ran, timeout=10, what="the released urgent step to run")
    assert ran == ["gate", "urgent"]


def test_a_release_lowers_only_the_floors_whose_claims_may_take_the_step():
    """:meth:`ClaimFloors.lower` goes by the step's queue and type, and never raises a floor."""
    floors = ClaimFloors(clock=_Clock())
    at = datetime(2026, 1, 1, tzinfo=UTC)
    keys = {
        "any": FloorKey(worker_id="w", queues=("default",), job_types=None),
        "mail": FloorKey(worker_id="w", queues=("default",), job_types=("mail",)),
        "other": FloorKey(worker_id="w", queues=("reports",), job_types=None),
    }
    claimed = ClaimedJob(
        id=1, job_type="mail", queue="default", priority=5, payload={}, attempt=1,
        max_attempts=3, errors=(), next_run_at=at, created_at=at, batch_id=None,
        started_at=at, lease_expires_at=at,
    )  # fmt: skip
    for key in keys.values():
        floors.observe(key, [claimed], bounded=False)
    step = Released(job_id=2, queue="default", job_type="hook", priority=0, due=at)
    assert floors.lower([step])
    got = dict(floors.floors())
    assert got[keys["any"]] == ClaimFloor(priority=0, due=at)
    assert got[keys["mail"]].priority == 5  # its claims take no "hook" job
    assert got[keys["other"]].priority == 5  # nor any job of queue "default"
    later = Released(job_id=3, queue="default", job_type="mail", priority=9, due=at)
    assert not floors.lower([later])  # sorts after every floor: none goes up
    assert dict(floors.floors())[keys["any"]] == ClaimFloor(priority=0, due=at)
    assert dict(floors.floors())[keys["mail"]].due == at - timedelta(seconds=10)
