"""A worker claims only the job types it has a task for (issue 30, item 1).

Jobs of other types stay ``queued`` with no attempt used, for a worker that knows them; a burst
worker does not wait for them; a worker with no task refuses to start; and ``health`` raises
``unknown_type`` when due jobs of a type that no live worker of their queue knows wait too
long. Live workers are read from ``sqlqueue_workers``, which each worker keeps current.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa

import sqlqueue
from sqlqueue._schema import jobs, workers
from tests._support import WorkerThread, db_now, drain, wait_until
from tests.conftest import Backend

pytestmark = pytest.mark.timeout(120)


def _producer(backend: Backend) -> sqlqueue.Queue:
    """The app that enqueues: it knows every type (its own worker is never started)."""
    queue = backend.queue()
    for job_type in ("typed.a", "typed.b", "typed.c"):
        queue.task(job_type)(lambda: None)
    return queue


def _enqueue(queue: sqlqueue.Queue, *job_types: str) -> list[int]:
    with queue.engine.begin() as conn:
        return [queue.enqueue(conn, job_type) for job_type in job_types]


def _job(queue: sqlqueue.Queue, job_id: int) -> sqlqueue.Job:
    job = queue.get_job(job_id)
    assert job is not None, f"job {job_id} vanished"
    return job


def _backdate(backend: Backend, job_ids: list[int], seconds: float) -> None:
    """Make jobs due ``seconds`` ago (by the database clock), as if they had waited that long."""
    due = db_now(backend.engine) - timedelta(seconds=seconds)
    with backend.engine.begin() as conn:
        conn.execute(sa.update(jobs).where(jobs.c.id.in_(job_ids)).values(next_run_at=due))


def test_jobs_of_types_a_worker_has_no_task_for_stay_queued(backend: Backend) -> None:
    a, b = _enqueue(_producer(backend), "typed.a", "typed.b")
    consumer = backend.queue()
    ran: list[str] = []

    @consumer.task("typed.a")
    def typed_a() -> None:
        ran.append("a")

    finished = threading.Event()

    def run() -> None:
        drain(consumer)  # a burst worker: returns once nothing it can run is due
        finished.set()

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    runner.join(timeout=60)
    assert finished.is_set(), "the burst worker waited for a job it cannot run"
    assert ran == ["a"]
    assert _job(consumer, a).status == "succeeded"
    job = _job(consumer, b)
    assert (job.status, job.attempts, job.locked_by, job.last_error) == ("queued", 0, None, None)


def test_the_dead_policy_still_claims_strays_and_kills_them(backend: Backend) -> None:
    (b,) = _enqueue(_producer(backend), "typed.b")
    consumer = backend.queue(unknown_jobs="dead")
    consumer.task("typed.a")(lambda: None)
    drain(consumer)
    job = _job(consumer, b)
    assert (job.status, job.attempts) == ("dead", 1)
    assert job.errors[-1].kind == "UnknownJobType"


def test_a_worker_with_no_task_refuses_to_start(backend: Backend) -> None:
    queue = backend.queue()
    with pytest.raises(sqlqueue.ConfigurationError, match="no task is registered on this Queue"):
        queue.worker().run(burst=True)
    with backend.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(workers)).scalar_one() == 0


def test_a_serving_worker_is_listed_live_with_its_types_and_leaves_at_a_clean_stop(
    backend: Backend,
) -> None:
    consumer = backend.queue()
    consumer.task("typed.a")(lambda: None)
    consumer.task("typed.b", queue="other")(lambda: None)
    served = consumer.worker(queues={"default": 3, "other": 1}, poll_interval=0.05)
    with WorkerThread(served):
        (worker,) = wait_until_live(consumer, 1)
        assert worker.id == served.worker_id
        assert worker.queues == {"default", "other"}
        assert worker.job_types == {"typed.a", "typed.b"}
        with backend.engine.connect() as conn:
            row = conn.execute(sa.select(workers)).mappings().one()
        assert row["queues"] == {"default": 3, "other": 1}
        assert not row["stopping"]
        assert row["expires_at"] > row["last_seen_at"]
    assert consumer.admin.live_workers() == []
    with backend.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(workers)).scalar_one() == 0


def wait_until_live(queue: sqlqueue.Queue, count: int) -> list[Any]:
    """The live workers, once there are ``count`` of them."""
    found: list[Any] = []

    def listed() -> bool:
        found[:] = queue.admin.live_workers()
        return len(found) == count

    wait_until(listed, timeout=20)
    return found


def test_a_worker_gone_without_a_word_is_not_live(backend: Backend) -> None:
    queue = backend.queue()
    admin = queue.admin
    facts = {"host": "h", "pid": 1, "version": "0", "running": 0, "stopping": False}
    admin.announce_worker(
        worker_id="gone",
        facts={**facts, "queues": {"default": 1}, "job_types": ["typed.a"]},
        expires_in=-1.0,
    )
    admin.announce_worker(
        worker_id="alive",
        facts={**facts, "queues": {"default": 1}, "job_types": ["typed.b"]},
        expires_in=60.0,
    )
    assert [worker.id for worker in admin.live_workers()] == ["alive"]


def test_health_names_the_types_no_live_worker_knows_and_how_long_they_waited(
    backend: Backend,
) -> None:
    producer = _producer(backend)
    consumer = backend.queue()
    consumer.task("typed.a")(lambda: None)
    with WorkerThread(consumer.worker(poll_interval=0.05)):
        wait_until_live(consumer, 1)
        late_b = _enqueue(producer, "typed.b", "typed.b", "typed.c")
        _backdate(backend, late_b[:1], 900)
        _backdate(backend, late_b[1:], 600)
        health = consumer.health(max_queued_age=300)
        (alarm,) = health.alarms  # no queued_age: the known type's jobs are not late
        assert (alarm.name, alarm.queue, alarm.job_types) == (
            "unknown_type",
            "default",
            ("typed.b", "typed.c"),
        )
        assert 890 < alarm.figure < 1000
        assert alarm.threshold == 300
        assert "\n" not in alarm.message
        assert "no live worker has a task for 'typed.b' (2 due jobs, oldest 9" in alarm.message
        assert "'typed.c' (1 due job, oldest 6" in alarm.message
        assert alarm.to_dict()["job_types"] == ["typed.b", "typed.c"]
        # Under the threshold: nothing to say.
        assert consumer.health(max_queued_age=3600).ok
    # No live worker serves the queue at all: the queue's own alarm says so (and no_workers:
    # the stopped worker left no row, so the queue counts as unserved since its jobs were due).
    health = consumer.health(max_queued_age=300)
    assert [alarm.name for alarm in health.alarms] == ["queued_age", "no_workers"]
    assert "is any worker serving it?" in health.alarms[0].message


def _announce(queue: sqlqueue.Queue, worker_id: str, job_types: list[str] | None) -> None:
    """A live worker's row on ``default``, as its upkeep writes it."""
    facts = {"host": "h", "pid": 1, "version": "0", "running": 0, "stopping": False}
    queue.admin.announce_worker(
        worker_id=worker_id,
        facts={**facts, "queues": {"default": 1}, "job_types": job_types},
        expires_in=60.0,
    )


def test_health_keeps_queued_age_for_late_jobs_a_live_worker_knows(backend: Backend) -> None:
    producer = _producer(backend)
    a, b = _enqueue(producer, "typed.a", "typed.b")
    _backdate(backend, [a], 700)
    _backdate(backend, [b], 400)
    _announce(producer, "knows-a", ["typed.a"])
    alarms = {alarm.name: alarm for alarm in producer.health(max_queued_age=300).alarms}
    assert set(alarms) == {"unknown_type", "queued_age"}
    assert alarms["unknown_type"].job_types == ("typed.b",)
    assert 390 < alarms["unknown_type"].figure < 500
    assert 690 < alarms["queued_age"].figure < 800  # the known type's job, not the stray's
    # Another live worker knows typed.b: only the queue's lateness is left.
    _announce(producer, "knows-b", ["typed.b"])
    assert [alarm.name for alarm in producer.health(max_queued_age=300).alarms] == ["queued_age"]


def test_a_worker_that_claims_every_type_raises_no_unknown_type(backend: Backend) -> None:
    producer = _producer(backend)
    _backdate(backend, _enqueue(producer, "typed.c"), 600)
    _announce(producer, "dead-policy", None)
    assert [alarm.name for alarm in producer.health(max_queued_age=300).alarms] == ["queued_age"]


def test_a_groups_older_job_of_an_unknown_type_still_goes_first(backend: Backend) -> None:
    producer = _producer(backend)
    with backend.engine.begin() as conn:
        first = producer.enqueue(conn, "typed.b", group_key="order:7")
        second = producer.enqueue(conn, "typed.a", group_key="order:7")
    knows_a = backend.queue()
    knows_a.task("typed.a")(lambda: None)
    drain(knows_a)  # per-key order: typed.a waits behind the group's older typed.b
    assert (_job(knows_a, first).status, _job(knows_a, second).status) == ("queued", "queued")
    knows_b = backend.queue()
    knows_b.task("typed.b")(lambda: None)
    drain(knows_b)
    drain(knows_a)
    assert _job(knows_a, first).status == _job(knows_a, second).status == "succeeded"
    finished, started = _job(knows_a, first).finished_at, _job(knows_a, second).started_at
    assert finished is not None
    assert started is not None
    assert finished <= started


def test_priorities_order_the_known_types_and_skip_the_others(backend: Backend) -> None:
    producer = _producer(backend)
    with backend.engine.begin() as conn:
        stray = producer.enqueue(conn, "typed.b", priority=-10)
        low = producer.enqueue(conn, "typed.a", priority=5)
        high = producer.enqueue(conn, "typed.c", priority=0)
    consumer = backend.queue()
    ran: list[str] = []
    consumer.task("typed.a")(lambda: ran.append("a"))
    consumer.task("typed.c")(lambda: ran.append("c"))
    drain(consumer)
    assert ran == ["c", "a"]
    assert _job(consumer, stray).status == "queued"
    assert {_job(consumer, low).status, _job(consumer, high).status} == {"succeeded"}
