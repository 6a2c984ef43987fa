"""Batches: children written atomically with their batch, a callback enqueued exactly once when
the last child ends (whatever ended it: a worker, the reaper, an operator), counts by status,
fan-out from a running child, and what bad input is told. Every backend; the same with real
worker processes and a SIGKILL is in tests/test_batches_processes.py, and what operators do to
children (requeue, discard, retry now, retention) in tests/test_batches_operators.py."""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

import sqlqueue
from sqlqueue import JobRequest, JobStatus
from sqlqueue._schema import batches, jobs
from sqlqueue._store import batches as store_batches
from sqlqueue._store import outcomes
from tests._support import count_jobs, drain, wait_until
from tests.conftest import Backend

#: What the test handlers saw: job type -> the payloads / batch snapshots they ran with.
Seen = dict[str, list[Any]]


def _queue(backend: Backend, **options: Any) -> tuple[sqlqueue.Queue, Seen]:
    """A queue with the batch test tasks; returns what their handlers record."""
    queue = backend.queue(**options)
    seen: Seen = {"child": [], "done": [], "failed_batch": [], "fan": []}

    @queue.task("child", max_attempts=1)
    def child(n: int, fail: bool = False) -> int:
        seen["child"].append(n)
        if fail:
            raise ValueError(f"child {n} fails")
        return n

    @queue.task("done", queue="callbacks")
    def done(label: str, ctx: sqlqueue.JobContext) -> None:
        seen["done"].append((label, ctx.batch))

    @queue.task("failed_batch", queue="callbacks")
    def failed_batch(label: str, ctx: sqlqueue.JobContext) -> None:
        seen["failed_batch"].append((label, ctx.batch))

    @queue.task("fan")
    def fan(parts: int, ctx: sqlqueue.JobContext) -> None:
        ids = ctx.add_to_batch([JobRequest(job_type="child", payload={"n": 100 + i})
                                for i in range(parts)])  # fmt: skip
        seen["fan"].append((ids, ctx.batch))

    return queue, seen


def _children(count: int, **payload: Any) -> list[JobRequest]:
    return [JobRequest(job_type="child", payload={"n": n, **payload}) for n in range(count)]


def _enqueue_batch(queue: sqlqueue.Queue, requests: list[JobRequest], **options: Any) -> Any:
    with queue.engine.begin() as conn:
        return queue.enqueue_batch(conn, requests, **options)


def _status(queue: sqlqueue.Queue, batch_id: int) -> sqlqueue.BatchStatus:
    status = queue.get_batch(batch_id)
    assert status is not None, f"batch {batch_id} vanished"
    return status


def _job(queue: sqlqueue.Queue, job_id: int) -> sqlqueue.Job:
    job = queue.get_job(job_id)
    assert job is not None, f"job {job_id} vanished"
    return job


def _counts(status: sqlqueue.BatchStatus) -> dict[str, int]:
    """The non-zero counts, by plain status name."""
    return {str(key): value for key, value in status.counts.items() if value}


def _callbacks(engine: sa.Engine, *job_types: str) -> int:
    query = sa.select(sa.func.count()).select_from(jobs).where(jobs.c.job_type.in_(job_types))
    with engine.connect() as conn:
        return int(conn.execute(query).scalar_one())


DONE = JobRequest(job_type="done", payload={"label": "all done"})
FAILED = JobRequest(job_type="failed_batch", payload={"label": "some died"})


# -- writing a batch -----------------------------------------------------------------------------


def test_a_batch_and_its_children_are_written_in_the_callers_transaction(backend):
    queue, _ = _queue(backend)
    batch = _enqueue_batch(queue, _children(3), on_complete=DONE)
    assert isinstance(batch, sqlqueue.Batch)
    assert len(batch.job_ids) == 3
    for job_id in batch.job_ids:
        assert _job(queue, job_id).status is JobStatus.QUEUED
    status = _status(queue, batch.id)
    assert status.id == batch.id
    assert status.total == 3
    assert set(status.counts) == set(JobStatus)
    assert _counts(status) == {"queued": 3}
    assert (status.done, status.pending, status.finished) == (0, 3, False)
    assert status.finished_at is None
    assert status.callback_job_id is None
    assert status.created_at.tzinfo is not None
    with queue.engine.connect() as conn:  # no on_dead: SQL NULL, not a JSON null
        row = conn.execute(
            sa.select(batches.c.on_dead.is_(None), batches.c.on_complete.is_(None))
        ).one()
    assert tuple(row) == (True, False)


def test_a_rolled_back_batch_leaves_nothing(backend):
    queue, _ = _queue(backend)
    with queue.engine.connect() as conn, conn.begin() as transaction:
        batch = queue.enqueue_batch(conn, _children(4), on_complete=DONE)
        transaction.rollback()
    assert queue.get_batch(batch.id) is None
    assert count_jobs(queue.engine) == 0
    with queue.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(batches)).scalar_one() == 0


def test_a_batch_is_written_through_an_orm_session(backend):
    queue, _ = _queue(backend)
    with Session(queue.engine) as session, session.begin():
        batch = queue.enqueue_batch(session, _children(2), on_complete=DONE)
    assert _status(queue, batch.id).total == 2
    with Session(queue.engine) as session:
        session.begin()
        rolled_back = queue.enqueue_batch(session, _children(2), on_complete=DONE)
        session.rollback()
    assert queue.get_batch(rolled_back.id) is None


def test_an_unknown_batch_reads_as_none(backend):
    queue, _ = _queue(backend)
    assert queue.get_batch(12345) is None


# -- the callback --------------------------------------------------------------------------------


def test_the_callback_runs_once_after_the_last_child_and_reads_the_counts(backend):
    queue, seen = _queue(backend)
    batch = _enqueue_batch(queue, _children(5), on_complete=DONE)
    drain(queue, queues=["default"])
    assert sorted(seen["child"]) == [0, 1, 2, 3, 4]
    status = _status(queue, batch.id)
    assert status.finished
    assert status.callback_job_id is not None
    assert _counts(status) == {"succeeded": 5}
    callback = _job(queue, status.callback_job_id)
    assert (callback.job_type, callback.queue, callback.status) == ("done", "callbacks", "queued")
    assert callback.payload == {"label": "all done"}
    drain(queue)
    assert _job(queue, status.callback_job_id).status is JobStatus.SUCCEEDED
    ((label, seen_batch),) = seen["done"]
    assert label == "all done"
    assert seen_batch.id == batch.id
    assert (seen_batch.total, seen_batch.succeeded, seen_batch.done) == (5, 5, 5)
    assert seen_batch.finished_at == status.finished_at
    assert _callbacks(queue.engine, "done", "failed_batch") == 1


def test_a_dead_child_sends_the_batch_to_on_dead_instead(backend):
    queue, seen = _queue(backend)
    requests = [*_children(3), JobRequest(job_type="child", payload={"n": 9, "fail": True})]
    _enqueue_batch(queue, requests, on_complete=DONE, on_dead=FAILED)
    drain(queue)
    assert seen["done"] == []
    ((label, seen_batch),) = seen["failed_batch"]
    assert label == "some died"
    assert _counts(seen_batch) == {"succeeded": 3, "dead": 1}
    assert _callbacks(queue.engine, "done", "failed_batch") == 1


def test_without_on_dead_a_batch_with_dead_children_still_completes(backend):
    queue, seen = _queue(backend)
    requests = [JobRequest(job_type="child", payload={"n": 1, "fail": True}), *_children(1)]
    batch = _enqueue_batch(queue, requests, on_complete=DONE)
    drain(queue)
    ((_, seen_batch),) = seen["done"]
    assert _counts(seen_batch) == {"succeeded": 1, "dead": 1}
    assert _status(queue, batch.id).dead == 1


def test_a_batch_of_one(backend):
    queue, seen = _queue(backend)
    batch = _enqueue_batch(queue, _children(1), on_complete=DONE)
    assert len(batch.job_ids) == 1
    assert _job(queue, batch.job_ids[0]).status is JobStatus.QUEUED
    drain(queue)
    ((_, seen_batch),) = seen["done"]
    assert (seen_batch.total, seen_batch.succeeded) == (1, 1)


def test_an_empty_batch_is_finished_at_once_and_enqueues_its_callback(backend):
    queue, seen = _queue(backend)
    batch = _enqueue_batch(queue, [], on_complete=DONE, on_dead=FAILED)
    assert batch.job_ids == ()
    status = _status(queue, batch.id)
    assert status.finished
    assert status.total == 0
    assert status.callback_job_id is not None
    assert _job(queue, status.callback_job_id).job_type == "done"
    drain(queue)
    ((_, seen_batch),) = seen["done"]
    assert (seen_batch.total, seen_batch.done) == (0, 0)


def test_an_empty_batch_rolled_back_takes_its_callback_with_it(backend):
    queue, _ = _queue(backend)
    with queue.engine.connect() as conn, conn.begin() as transaction:
        queue.enqueue_batch(conn, [], on_complete=DONE)
        transaction.rollback()
    assert count_jobs(queue.engine) == 0


def test_a_batch_without_a_callback_still_finishes(backend):
    queue, _ = _queue(backend)
    batch = _enqueue_batch(queue, _children(2))
    drain(queue)
    status = _status(queue, batch.id)
    assert status.finished
    assert status.callback_job_id is None
    assert _counts(status) == {"succeeded": 2}


def test_a_callbacks_delay_counts_from_when_the_batch_finished(backend):
    queue, _ = _queue(backend)
    later = JobRequest(job_type="done", payload={"label": "later"}, delay=3600)
    batch = _enqueue_batch(queue, _children(1), on_complete=later)
    drain(queue, queues=["default"])
    status = _status(queue, batch.id)
    assert status.callback_job_id is not None
    assert status.finished_at is not None
    callback = _job(queue, status.callback_job_id)
    assert callback.next_run_at - status.finished_at >= timedelta(seconds=3599)


def test_two_children_ending_in_concurrent_transactions_enqueue_one_callback(backend):
    """The last two children end in two open transactions: the second waits on the batch
    (its row lock; SQLite's one writer) until the first commits, then adds to what the first
    wrote and alone sees the count reach the total."""
    queue, _ = _queue(backend)
    batch = _enqueue_batch(queue, _children(2), on_complete=DONE)
    first, second = (
        queue.store.claim(
            queues=["default"], job_types=None, limit=1, worker_id=worker, lease_seconds=60
        )[0]
        for worker in ("w1", "w2")
    )
    assert {first.id, second.id} == set(batch.job_ids)
    dialect = queue.store.dialect
    with queue.store.engine.connect() as conn:
        dialect.begin_write(conn)
        endings = store_batches.Endings()
        landed = outcomes.complete(
            conn, dialect, worker_id="w1", fences=[first.fence], endings=endings
        )
        assert landed == {first.id}
        assert store_batches.settle(conn, dialect, endings).callbacks == []  # 1 of 2: not the last
        finishing = threading.Thread(
            target=queue.store.finish,
            kwargs={"worker_id": "w2", "succeeded": [second.fence], "failures": []},
        )
        finishing.start()
        finishing.join(0.5)
        assert finishing.is_alive(), "the second ending did not wait for the first"
        conn.commit()
    finishing.join(30)
    assert not finishing.is_alive()
    status = _status(queue, batch.id)
    assert status.finished
    assert _counts(status) == {"succeeded": 2}
    assert _callbacks(queue.engine, "done") == 1


def test_a_round_ending_children_of_two_batches_locks_them_in_batch_id_order(backend):
    """Batch rows are locked in batch id order, whatever order the children ended in: a round
    whose endings name batch 2 first, waiting for batch 1 (which another transaction holds),
    holds no lock on batch 2 meanwhile, so nobody can wait on it crosswise (deadlock)."""
    backend.requires("row_locks")
    queue, _ = _queue(backend)
    first = _enqueue_batch(queue, [JobRequest(job_type="child", payload={"n": n}, queue="b1")
                                   for n in range(3)])  # fmt: skip
    second = _enqueue_batch(queue, [JobRequest(job_type="child", payload={"n": n}, queue="b2")
                                    for n in range(3)])  # fmt: skip
    assert first.id < second.id

    def claim(name: str, worker: str) -> Any:
        return queue.store.claim(
            queues=[name], job_types=None, limit=1, worker_id=worker, lease_seconds=60
        )[0]

    holder, dead_one = claim("b1", "w0"), claim("b1", "wA")
    succeeded, other = claim("b2", "wA"), claim("b2", "wC")
    dialect = queue.store.dialect
    with queue.store.engine.connect() as conn:  # holds batch 1's row
        dialect.begin_write(conn)
        endings = store_batches.Endings()
        outcomes.complete(conn, dialect, worker_id="w0", fences=[holder.fence], endings=endings)
        store_batches.settle(conn, dialect, endings)
        # Its success is noted first (batch 2), its failure after (batch 1).
        crossing = threading.Thread(
            target=queue.store.finish,
            kwargs={
                "worker_id": "wA",
                "succeeded": [succeeded.fence],
                "failures": [
                    sqlqueue._store.rows.Failure(
                        job_id=dead_one.id,
                        attempt=dead_one.attempt,
                        dead=True,
                        retry_in=0,
                        last_error="boom",
                        errors=[],
                    )
                ],
            },
        )
        crossing.start()
        crossing.join(0.5)
        assert crossing.is_alive(), "the round did not wait for batch 1"
        beside = threading.Thread(
            target=queue.store.finish,
            kwargs={"worker_id": "wC", "succeeded": [other.fence], "failures": []},
        )
        beside.start()
        beside.join(20)
        stuck = beside.is_alive()
        conn.commit()
    crossing.join(30)
    beside.join(30)
    assert not stuck, "batch 2 was locked by a round still waiting for batch 1"
    assert not crossing.is_alive()
    assert _counts(_status(queue, first.id)) == {"succeeded": 1, "dead": 1, "queued": 1}
    assert _counts(_status(queue, second.id)) == {"succeeded": 2, "queued": 1}


# -- every way a child ends counts -------------------------------------------------------------


def test_cancelled_children_count_and_the_last_cancel_enqueues_the_callback(backend):
    queue, seen = _queue(backend)
    batch = _enqueue_batch(queue, _children(3), on_complete=DONE, on_dead=FAILED)
    queue.cancel(batch.job_ids[0])
    assert _counts(_status(queue, batch.id)) == {"queued": 2, "cancelled": 1}
    assert queue.cancel_where(job_type="child") == 2
    status = _status(queue, batch.id)
    assert status.finished
    assert _counts(status) == {"cancelled": 3}
    drain(queue)
    ((_, seen_batch),) = seen["done"]  # cancelled is not dead: on_complete
    assert seen_batch.cancelled == 3


def test_cancel_where_counts_children_of_several_batches_beside_plain_jobs(backend):
    queue, _ = _queue(backend)
    first = _enqueue_batch(queue, _children(2), on_complete=DONE)
    second = _enqueue_batch(queue, _children(3), on_complete=DONE)
    with queue.engine.begin() as conn:
        queue.enqueue(conn, "child", {"n": 50})
    assert queue.cancel_where(job_type="child") == 6
    for batch, total in ((first, 2), (second, 3)):
        status = _status(queue, batch.id)
        assert status.finished
        assert _counts(status) == {"cancelled": total}
    assert _callbacks(queue.engine, "done") == 2


def test_a_running_child_whose_cancel_was_requested_ends_cancelled_and_counts(backend):
    queue = backend.queue()
    started = threading.Event()

    @queue.task("slow", max_attempts=3, backoff=[0])
    def slow(ctx: sqlqueue.JobContext) -> None:
        started.set()
        wait_until(lambda: ctx.cancelled, timeout=30)
        raise RuntimeError("stopped")

    @queue.task("done")
    def done() -> None:
        pass

    batch = _enqueue_batch(
        queue, [JobRequest(job_type="slow")], on_complete=JobRequest(job_type="done")
    )
    worker = threading.Thread(target=drain, args=(queue,), kwargs={"queues": ["default"]})
    worker.start()
    assert started.wait(30)
    queue.cancel(batch.job_ids[0])
    worker.join(60)
    assert not worker.is_alive()
    assert _job(queue, batch.job_ids[0]).status is JobStatus.CANCELLED
    status = _status(queue, batch.id)
    assert status.finished
    assert _counts(status) == {"cancelled": 1}


def test_a_child_that_times_out_on_its_last_attempt_counts_dead(backend):
    queue = backend.queue()

    @queue.task("sleepy", max_attempts=1, timeout=0.2)
    async def sleepy() -> None:
        await asyncio.sleep(30)

    @queue.task("done")
    def done() -> None:
        pass

    batch = _enqueue_batch(queue, [JobRequest(job_type="sleepy")], on_complete=DONE_PLAIN)
    drain(queue)
    status = _status(queue, batch.id)
    assert status.finished
    assert _counts(status) == {"dead": 1}
    assert _job(queue, batch.job_ids[0]).status is JobStatus.DEAD


DONE_PLAIN = JobRequest(job_type="done")


def test_the_reaper_giving_up_on_a_child_counts_it_dead(backend):
    queue, _ = _queue(backend, lease_seconds=0.2)
    batch = _enqueue_batch(queue, _children(1), on_complete=DONE, on_dead=FAILED)
    claimed = queue.store.claim(
        queues=["default"], job_types=None, limit=1, worker_id="gone", lease_seconds=0.2
    )
    assert [job.id for job in claimed] == list(batch.job_ids)
    assert claimed[0].batch_id == batch.id

    def reaped() -> bool:
        return bool(queue.store.reap_expired()[1])

    wait_until(reaped, timeout=10)
    status = _status(queue, batch.id)
    assert status.finished
    assert _counts(status) == {"dead": 1}
    assert _job(queue, status.callback_job_id).job_type == "failed_batch"  # type: ignore[arg-type]


# -- fan-out from a running child ----------------------------------------------------------------


def test_a_child_adds_children_and_the_batch_waits_for_them(backend):
    queue, seen = _queue(backend)
    batch = _enqueue_batch(
        queue, [JobRequest(job_type="fan", payload={"parts": 3})], on_complete=DONE
    )
    drain(queue, queues=["default"], concurrency=1)
    ((ids, seen_from_fan),) = seen["fan"]
    assert len(ids) == 3
    assert seen_from_fan.total == 1  # the added ones count from the parent's commit
    status = _status(queue, batch.id)
    assert status.finished
    assert status.total == 4
    assert _counts(status) == {"succeeded": 4}
    assert sorted(seen["child"]) == [100, 101, 102]
    drain(queue)
    ((_, seen_batch),) = seen["done"]
    assert seen_batch.total == 4


def test_children_added_by_a_failed_attempt_vanish_with_it(backend):
    queue = backend.queue()
    attempts: list[int] = []

    @queue.task("fan_then_fail", max_attempts=2, backoff=[0])
    def fan_then_fail(ctx: sqlqueue.JobContext) -> None:
        ctx.add_to_batch([JobRequest(job_type="leaf")])
        attempts.append(ctx.attempt)
        if ctx.attempt == 1:
            raise RuntimeError("first attempt fails after adding")

    @queue.task("leaf")
    def leaf() -> None:
        pass

    batch = _enqueue_batch(queue, [JobRequest(job_type="fan_then_fail")])
    drain(queue)
    wait_until(lambda: _status(queue, batch.id).finished, timeout=30)
    status = _status(queue, batch.id)
    assert attempts == [1, 2]
    assert (status.total, status.succeeded) == (2, 2)
    assert count_jobs(queue.engine, job_type="leaf") == 1


def test_an_async_child_adds_children(backend):
    queue = backend.queue()

    @queue.task("afan")
    async def afan(ctx: sqlqueue.JobContext) -> list[int]:
        return await ctx.add_to_batch_async(
            [JobRequest(job_type="leaf"), JobRequest(job_type="leaf")]
        )

    @queue.task("leaf")
    def leaf() -> None:
        pass

    batch = _enqueue_batch(queue, [JobRequest(job_type="afan")])
    drain(queue)
    asyncio.run(queue.async_engine().dispose())
    wait_until(lambda: _status(queue, batch.id).finished, timeout=30)
    status = _status(queue, batch.id)
    assert (status.total, status.succeeded) == (3, 3)
    assert len(_job(queue, batch.job_ids[0]).result) == 2


def test_add_to_batch_outside_a_batch_or_from_the_callback_is_refused(backend):
    queue = backend.queue()
    errors: list[str] = []

    @queue.task("lonely", max_attempts=1)
    def lonely(ctx: sqlqueue.JobContext) -> None:
        assert ctx.batch is None
        try:
            ctx.add_to_batch([JobRequest(job_type="leaf")])
        except sqlqueue.JobStateError as error:
            errors.append(str(error))

    @queue.task("callback", max_attempts=1)
    def callback(ctx: sqlqueue.JobContext) -> None:
        try:
            ctx.add_to_batch([JobRequest(job_type="leaf")])
        except sqlqueue.JobStateError as error:
            errors.append(str(error))

    @queue.task("leaf")
    def leaf() -> None:
        pass

    with queue.engine.begin() as conn:
        queue.enqueue(conn, "lonely")
    _enqueue_batch(
        queue, [JobRequest(job_type="leaf")], on_complete=JobRequest(job_type="callback")
    )
    drain(queue)
    assert len(errors) == 2
    assert "is not in a batch" in errors[0]
    assert "has finished" in errors[1]
    assert count_jobs(queue.engine, job_type="leaf") == 1


# -- bad input -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("requests", "options", "message"),
    [
        ([JobRequest(job_type="nope")], {}, "no task named 'nope'"),
        ([JobRequest(job_type="child", payload={"n": 1}), "child"], {}, "batch child 3 must be"),
        (
            [JobRequest(job_type="child", payload={"n": 1}, idempotency_key="k")],
            {},
            "cannot have one",
        ),
        ([], {"on_complete": "done"}, "on_complete must be a sqlqueue.JobRequest"),
        ([], {"on_dead": {"job_type": "done"}}, "on_dead must be a sqlqueue.JobRequest"),
        ([], {"on_complete": JobRequest(job_type="nope")}, "no task named 'nope'"),
        (
            [],
            {"on_complete": JobRequest(job_type="done", idempotency_key="once")},
            "exactly once already",
        ),
        ([JobRequest(job_type="child", payload={"n": 1}, delay=-1)], {}, "delay must be >= 0"),
    ],
)
def test_bad_batches_are_refused_before_anything_is_written(backend, requests, options, message):
    queue, _ = _queue(backend)
    with queue.engine.connect() as conn, conn.begin():
        with pytest.raises(sqlqueue.EnqueueError, match=message):
            queue.enqueue_batch(conn, [*_children(2), *requests], **options)
        # The caller's transaction is still usable: nothing was sent.
        queue.enqueue(conn, "child", {"n": 99})
    assert count_jobs(queue.engine) == 1
    with queue.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(batches)).scalar_one() == 0


def test_the_children_are_an_iterable_of_requests_not_one_request(backend):
    queue, _ = _queue(backend)
    with queue.engine.begin() as conn:
        with pytest.raises(sqlqueue.EnqueueError, match="wrap a single request in a list"):
            queue.enqueue_batch(conn, JobRequest(job_type="child", payload={"n": 1}))  # type: ignore[arg-type]
        batch = queue.enqueue_batch(conn, (request for request in _children(3)))
    assert _status(queue, batch.id).total == 3
    assert count_jobs(queue.engine) == 3


def test_enqueue_batch_async(backend):
    queue, _ = _queue(backend)

    async def main() -> tuple[sqlqueue.Batch, sqlqueue.Batch]:
        engine = queue.async_engine()
        try:
            async with engine.begin() as conn:
                kept = await queue.enqueue_batch_async(conn, _children(2), on_complete=DONE)
            async with AsyncSession(engine) as session:
                dropped = await queue.enqueue_batch_async(session, _children(2))
                await session.rollback()
            return kept, dropped
        finally:
            await engine.dispose()

    kept, dropped = asyncio.run(main())
    assert _status(queue, kept.id).total == 2
    assert queue.get_batch(dropped.id) is None
    assert count_jobs(queue.engine) == 2
