"""Batches and what operators do to their children: a dead child requeued (one at a time or in
bulk, before or after the batch finished), discarded, retried now; retention pruning children
and then the batch's row; and what ``get_job``, ``sqlqueue batch show`` and ``jobs show`` print.
Every backend; the core (writing, the callback, every way a child ends) is in
tests/test_batches.py."""

from __future__ import annotations

import json

import sqlalchemy as sa

import sqlqueue
from sqlqueue import JobRequest, JobStatus
from sqlqueue._schema import batches, jobs
from tests._support import bounded, count_jobs, drain, wait_until
from tests._support import run_cli as cli
from tests.test_batches import (
    DONE,
    FAILED,
    _callbacks,
    _children,
    _counts,
    _enqueue_batch,
    _job,
    _queue,
    _status,
)

# -- requeue after the batch -----------------------------------------------------------------------


def test_a_dead_child_requeued_after_the_batch_finished_runs_alone(backend):
    queue, seen = _queue(backend)
    requests = [JobRequest(job_type="child", payload={"n": 7, "fail": True})]
    batch = _enqueue_batch(queue, requests, on_complete=DONE, on_dead=FAILED)
    drain(queue)
    before = _status(queue, batch.id)
    assert before.finished
    assert len(seen["failed_batch"]) == 1
    new_id = queue.requeue(batch.job_ids[0], by="ops", reason="fixed")
    new_job = _job(queue, new_id)
    assert new_job.status is JobStatus.QUEUED
    assert _status(queue, batch.id) == before  # unchanged: no live counts, same callback
    with queue.engine.connect() as conn:
        kept = conn.execute(sa.select(jobs.c.batch_id).where(jobs.c.id == new_id)).scalar_one()
    assert kept == batch.id  # lineage
    drain(queue)
    assert seen["child"] == [7, 7]
    assert _job(queue, new_id).status is JobStatus.DEAD
    assert _status(queue, batch.id) == before
    assert len(seen["failed_batch"]) == 1
    assert seen["done"] == []
    assert _callbacks(queue.engine, "done", "failed_batch") == 1


def test_a_dead_child_requeued_while_its_batch_runs_is_waited_for(backend):
    queue, seen = _queue(backend)
    batch = _enqueue_batch(
        queue,
        [JobRequest(job_type="child", payload={"n": 1, "fail": True}), *_children(1)],
        on_complete=DONE,
        on_dead=FAILED,
    )
    # Run the failing child only, and hold the other one back.
    queue.store.claim(queues=["default"], job_types=None, limit=0, worker_id="x", lease_seconds=5)
    first = queue.store.claim(
        queues=["default"], job_types=None, limit=1, worker_id="w", lease_seconds=30
    )[0]
    assert first.id == batch.job_ids[0]
    queue.store.finish(
        worker_id="w",
        succeeded=[],
        failures=[
            sqlqueue._store.rows.Failure(
                job_id=first.id,
                attempt=first.attempt,
                dead=True,
                retry_in=0,
                last_error="boom",
                errors=[],
            )
        ],
    )
    assert _counts(_status(queue, batch.id)) == {"dead": 1, "queued": 1}
    queue.requeue(first.id, by="ops", reason="try again")
    assert _counts(_status(queue, batch.id)) == {"queued": 2}
    with queue.engine.begin() as conn:  # the requeued child now succeeds
        conn.execute(
            sa.update(jobs).where(jobs.c.requeued_from == first.id).values(payload={"n": 2})
        )
    drain(queue)
    assert seen["failed_batch"] == []
    ((_, seen_batch),) = seen["done"]
    assert _counts(seen_batch) == {"succeeded": 2}


def test_a_child_requeued_after_its_batch_finished_cannot_add_children(backend):
    queue = backend.queue()
    errors: list[str] = []

    @queue.task("fan_late", max_attempts=1)
    def fan_late(ctx: sqlqueue.JobContext) -> None:
        if ctx.job_id == batch.job_ids[0]:  # the child dies; the job requeued from it runs
            raise ValueError("the first run dies")
        try:
            ctx.add_to_batch([JobRequest(job_type="leaf")])
        except sqlqueue.JobStateError as error:
            errors.append(str(error))

    @queue.task("leaf")
    def leaf() -> None:
        pass

    batch = _enqueue_batch(queue, [JobRequest(job_type="fan_late")])
    drain(queue)
    assert _status(queue, batch.id).dead == 1
    new_id = queue.requeue(batch.job_ids[0], by="ops", reason="again")
    drain(queue)
    assert _job(queue, new_id).status is JobStatus.SUCCEEDED
    assert len(errors) == 1
    assert f"batch {batch.id} has finished" in errors[0]
    assert "a child requeued after it finished" in errors[0]
    assert count_jobs(queue.engine, job_type="leaf") == 0
    assert _status(queue, batch.id).total == 1


def test_bulk_requeue_where_takes_back_dead_endings_and_discard_where_changes_nothing(backend):
    """The operations API's (and the web page's) bulk actions: ``requeue_where`` goes through
    the same requeue as ``requeue`` (the running batch waits for the new jobs), ``discard_where``
    only marks dead rows handled (they counted as dead already)."""
    queue, seen = _queue(backend)
    held = JobRequest(job_type="child", payload={"n": 9}, queue="held")  # keeps it running
    requeued = _enqueue_batch(
        queue, [*_children(2, fail=True), held], on_complete=DONE, on_dead=FAILED
    )
    discarded = _enqueue_batch(
        queue, [_children(1, fail=True)[0], held], on_complete=DONE, on_dead=FAILED
    )
    drain(queue, queues=["default"])
    assert _counts(_status(queue, requeued.id)) == {"dead": 2, "queued": 1}
    new_ids = bounded(
        "requeue_where of two dead children",
        lambda: queue.requeue_where(by="ops", reason="fixed", job_ids=requeued.job_ids[:2]),
    )
    assert len(new_ids) == 2
    assert _counts(_status(queue, requeued.id)) == {"queued": 3}
    assert queue.discard_where(by="ops", reason="gone", job_ids=discarded.job_ids[:1]) == [
        discarded.job_ids[0]
    ]
    assert _counts(_status(queue, discarded.id)) == {"dead": 1, "queued": 1}
    with queue.engine.begin() as conn:  # the requeued children now succeed
        conn.execute(sa.update(jobs).where(jobs.c.id.in_(new_ids)).values(payload={"n": 3}))
    drain(queue, queues=["default", "held"])
    assert _counts(_status(queue, requeued.id)) == {"succeeded": 3}
    assert _counts(_status(queue, discarded.id)) == {"dead": 1, "succeeded": 1}
    left = bounded(
        "requeue_where with no dead child left",
        lambda: queue.requeue_where(by="ops", reason="no dead child is left"),
    )
    assert left == []
    drain(queue, queues=["callbacks"])
    assert [_counts(batch) for _, batch in seen["done"]] == [{"succeeded": 3}]
    assert [_counts(batch) for _, batch in seen["failed_batch"]] == [{"dead": 1, "succeeded": 1}]


def test_retry_now_makes_a_failed_child_due_and_the_batch_counts_its_end(backend):
    """``retry_now`` only moves a failed child's next run: the child is still on its way, and
    its batch finishes when the retry ends."""
    queue, seen = _queue(backend)

    @queue.task("flaky", max_attempts=2, backoff=[3600])
    def flaky(ctx: sqlqueue.JobContext) -> None:
        if ctx.attempt == 1:
            raise ValueError("first attempt fails")

    batch = _enqueue_batch(queue, [JobRequest(job_type="flaky")], on_complete=DONE)
    drain(queue, queues=["default"])
    assert _counts(_status(queue, batch.id)) == {"failed": 1}
    assert queue.retry_now(job_ids=batch.job_ids) == 1
    assert _counts(_status(queue, batch.id)) == {"failed": 1}
    drain(queue, queues=["default", "callbacks"])
    status = _status(queue, batch.id)
    assert status.finished
    assert _counts(status) == {"succeeded": 1}
    assert [_counts(batch) for _, batch in seen["done"]] == [{"succeeded": 1}]


# -- retention -----------------------------------------------------------------------------------


def _prune_until(queue: sqlqueue.Queue, *, left: int) -> None:
    """Prune succeeded jobs (the database clock must first pass their ``finished_at``) until
    ``left`` jobs remain."""
    wait_until(
        lambda: (
            queue.prune(older_than=0, statuses=["succeeded"]) >= 0
            and count_jobs(queue.engine) == left
        )
    )


def test_pruning_finished_children_keeps_the_counts_and_then_the_batch_row_goes(backend):
    """Retention deletes finished children without touching their batch's counters (a running
    batch still finishes right, once), and a finished batch's row goes with its last job."""
    queue, seen = _queue(backend)
    held = JobRequest(job_type="child", payload={"n": 9}, queue="held")
    batch = _enqueue_batch(queue, [*_children(2), held], on_complete=DONE)
    drain(queue, queues=["default"])
    _prune_until(queue, left=1)
    assert _counts(_status(queue, batch.id)) == {"succeeded": 2, "queued": 1}

    drain(queue, queues=["held"])  # the last child: the batch finishes, its callback waits
    status = _status(queue, batch.id)
    assert (status.finished, _counts(status)) == (True, {"succeeded": 3})
    _prune_until(queue, left=1)
    assert _status(queue, batch.id) == status  # the queued callback still refers to it
    drain(queue, queues=["callbacks"])
    assert [_counts(batch) for _, batch in seen["done"]] == [{"succeeded": 3}]
    assert _callbacks(queue.engine, "done") == 1

    _prune_until(queue, left=0)
    assert queue.get_batch(batch.id) is None
    with queue.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(batches)).scalar_one() == 0


def test_pruning_dead_children_takes_the_batch_row_with_the_last_of_them(backend):
    """The dead-jobs path of retention (select, then delete by id, reading the errors first)
    also returns each job's batch: the finished batch's row goes with its last dead child."""
    queue, seen = _queue(backend)
    batch = _enqueue_batch(queue, _children(2, fail=True), on_dead=FAILED)
    drain(queue, queues=["default"])
    drain(queue, queues=["callbacks"])
    assert [_counts(batch) for _, batch in seen["failed_batch"]] == [{"dead": 2}]
    assert count_jobs(queue.engine) == 3  # two dead children and the succeeded callback
    wait_until(
        lambda: (
            queue.prune(older_than=0, statuses=["succeeded"]) >= 0 and count_jobs(queue.engine) == 2
        )
    )
    assert _counts(_status(queue, batch.id)) == {"dead": 2}  # its dead children still hold it
    wait_until(
        lambda: queue.prune(older_than=0, statuses=["dead"]) >= 0 and count_jobs(queue.engine) == 0
    )
    assert queue.get_batch(batch.id) is None
    with queue.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(batches)).scalar_one() == 0


# -- operators -----------------------------------------------------------------------------------


def test_a_job_shows_its_batch_and_the_batch_show_command_prints_the_counts(backend):
    queue, _ = _queue(backend)
    batch = _enqueue_batch(queue, [*_children(2), _children(1, fail=True)[0]], on_complete=DONE)
    drain(queue, queues=["default"])
    status = _status(queue, batch.id)
    assert _job(queue, batch.job_ids[0]).batch_id == batch.id
    assert _job(queue, status.callback_job_id).batch_id == batch.id  # type: ignore[arg-type]

    shown = cli("batch", "show", str(batch.id), "--json", url=backend.url)
    assert shown.returncode == 0, shown.stderr
    document = json.loads(shown.stdout)
    assert document["total"] == 3
    assert document["done"] == 3
    assert document["counts"] == {
        "queued": 0, "running": 0, "succeeded": 2, "failed": 0, "dead": 1, "cancelled": 0,
        "waiting": 0,
    }  # fmt: skip
    assert document["callback_job_id"] == status.callback_job_id
    text = cli("batch", "show", str(batch.id), url=backend.url).stdout
    assert "done:             3 of 3" in text
    assert "dead:             1" in text
    job_text = cli("jobs", "show", str(batch.job_ids[0]), url=backend.url).stdout
    assert f"batch:            {batch.id}" in job_text
    missing = cli("batch", "show", "999999", url=backend.url)
    assert (missing.returncode, missing.stderr.strip()) == (
        1,
        "sqlqueue: error: there is no batch 999999",
    )
