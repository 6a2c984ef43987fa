"""Worker rounds that meet other transactions on a workflow's or a batch's row: two rounds
ending a diamond's middle steps, a step added while a round ends its upstream, a cancel beside
the last ending, a completion whose lease the reaper took. Each test holds one transaction open
while the other, started in a thread, really waits for its rows, then commits it
(:func:`~tests._support.locks.overlap`). On PostgreSQL a round told its batches takes the
folded completion (``settled_completion.py``), elsewhere the general path; SQLite's one writer
runs the two one after the other, which must give the same rows."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa

import sqlqueue
from sqlqueue import JobRequest, Workflow
from sqlqueue._schema import batches, jobs, workflow_steps
from sqlqueue._store import cancel, leases, outcomes, workflows
from sqlqueue._store.batches import Endings, settle
from sqlqueue._store.rows import ClaimedJob
from tests._support.locks import overlap
from tests.conftest import Backend

Write = Callable[[sa.Connection], Any]
STEP = JobRequest(job_type="step")


def _queue(backend: Backend) -> sqlqueue.Queue:
    queue = backend.queue()
    queue.task("step", max_attempts=2)(lambda: None)
    queue.task("done", max_attempts=1)(lambda: None)
    return queue


def _enqueue(queue: sqlqueue.Queue, steps: dict[str, list[str]], **options: Any) -> Any:
    """A workflow of steps ``{name: after}``, enqueued in that order."""
    wf = Workflow(**options)
    for name, after in steps.items():
        wf.add(name, STEP, after=after)
    with queue.engine.begin() as conn:
        return queue.enqueue_workflow(conn, wf)


def _claim(queue: sqlqueue.Queue, worker: str, limit: int = 100, **options: Any) -> Any:
    options.setdefault("lease_seconds", 60)
    claimed: list[ClaimedJob] = queue.store.claim(
        queues=["default"], job_types=None, limit=limit, worker_id=worker, **options
    )
    return claimed


def _batch_ids(ending: Sequence[ClaimedJob]) -> list[int]:
    """The batches the worker names with its jobs' successes (``succeeded_batches``)."""
    return sorted({job.batch_id for job in ending if job.batch_id is not None})


def _round(
    queue: sqlqueue.Queue, worker: str, ending: Sequence[ClaimedJob], *, named: bool = True
) -> Write:
    """A worker's round of successes, the writes of :meth:`Store.finish` in a transaction of
    the test's. ``named``: told the batches, as the worker tells it (PostgreSQL: the folded
    completion); else the general path that a round with a failure or a result takes."""
    fences = [job.fence for job in ending]
    batch_ids = _batch_ids(ending) if named else None
    store = queue.store
    return lambda conn: store._write_outcomes(conn, worker, fences, [], None, None, batch_ids)[0]


def _cancel(queue: sqlqueue.Queue, job_id: int) -> Write:
    """An operator's cancel of one job, the writes of :meth:`Queue.cancel`."""
    return lambda conn: cancel.cancel_job(conn, queue.dialect, job_id).status


def _add_step(
    queue: sqlqueue.Queue, workflow_id: int, adder: ClaimedJob, name: str, after: list[str]
) -> Write:
    """What running step ``adder`` writes when its handler calls ``ctx.add_to_workflow``: the
    step, its workflow's row taken first, then, in the same transaction, its own success and
    the ending counted, as the worker completes a step in its handler's transaction
    (``_worker/attempt.py``). Returns the new step's job id."""
    row = queue._workflow_row(name, STEP)

    def write(conn: sa.Connection) -> int:
        dialect = queue.dialect
        job_id = workflows.add_step(conn, dialect, workflow_id, name=name, row=row, after=after)
        endings = Endings()
        fences = [adder.fence]
        landed = outcomes.complete(
            conn, dialect, worker_id="w", fences=fences, results={adder.id: None}, endings=endings
        )
        assert landed == {adder.id}
        settle(conn, dialect, endings)
        return job_id

    return write


def _race(queue: sqlqueue.Queue, first: Write, second: Write) -> Any:
    """``second`` waiting for ``first``'s commit (where rows are locked, the server saw it
    wait); the results of both, which raised nothing."""
    seen = overlap(queue.engine, queue.dialect, first, second)
    assert seen.errors == []
    assert seen.waited == queue.dialect.supports_row_locks, "the two did not overlap"
    assert len(seen.other) == 1
    return seen.held, seen.other[0]


def _finish_all(queue: sqlqueue.Queue) -> list[int]:
    """Run every job left to its success, round by round as a worker does; the ids, in the
    order they ran (a job released twice would run twice)."""
    ran: list[int] = []
    while claimed := _claim(queue, "rest"):
        ran += [job.id for job in claimed]
        fences = [job.fence for job in claimed]
        queue.store.finish(
            worker_id="rest", succeeded=fences, failures=[], batch_ids=_batch_ids(claimed)
        )
    return ran


def _counters(queue: sqlqueue.Queue, batch_id: int) -> tuple[int, int, int, int, bool]:
    """``(total, succeeded, dead, cancelled, finished)`` of a batch's or workflow's row."""
    with queue.engine.connect() as conn:
        row = conn.execute(
            sa.select(
                batches.c.total,
                batches.c.succeeded,
                batches.c.dead,
                batches.c.cancelled,
                batches.c.finished_at,
            ).where(batches.c.id == batch_id)
        ).one()
    return int(row[0]), int(row[1]), int(row[2]), int(row[3]), row[4] is not None


def _steps(queue: sqlqueue.Queue, workflow_id: int) -> dict[str, tuple[str, int]]:
    """Each step's status (of the job its row points to) and how many upstreams it waits
    for; fails if the workflow has a job no step points to (a step's second job)."""
    with queue.engine.connect() as conn:
        rows = conn.execute(
            sa.select(workflow_steps.c.name, jobs.c.status, workflow_steps.c.waiting_on)
            .join_from(workflow_steps, jobs, jobs.c.id == workflow_steps.c.job_id)
            .where(workflow_steps.c.workflow_id == workflow_id)
        ).all()
        count = conn.execute(
            sa.select(sa.func.count()).select_from(jobs).where(jobs.c.batch_id == workflow_id)
        ).scalar_one()
    assert count == len(rows), f"workflow {workflow_id} has {count} jobs for {len(rows)} steps"
    return {str(name): (str(status), int(waiting)) for name, status, waiting in rows}


@pytest.mark.parametrize("first_named", [True, False], ids=["folded-first", "general-first"])
def test_two_rounds_ending_a_diamonds_middle_steps_release_its_join_once(
    backend: Backend, first_named: bool
):
    """Two workers end ``b`` and ``c`` of ``a → b, c → d`` at once, the second's round waiting
    for the first's commit: it must lower ``d``'s count from the row the first committed, not
    from the one its statement started with. ``d`` is then released once, runs once, and the
    workflow counts each success once. Broken, ``d`` would wait for ever (a count left at 1),
    or count an upstream twice (``waiting_on`` -1)."""
    queue = _queue(backend)
    handle = _enqueue(queue, {"a": [], "b": ["a"], "c": ["a"], "d": ["b", "c"]})
    [a] = _claim(queue, "w0")
    queue.store.finish(worker_id="w0", succeeded=[a.fence], failures=[], batch_ids=[handle.id])
    [b], [c] = _claim(queue, "w1", limit=1), _claim(queue, "w2", limit=1)
    landed = _race(queue, _round(queue, "w1", [b], named=first_named), _round(queue, "w2", [c]))
    assert landed == ({b.id}, {c.id})
    assert _steps(queue, handle.id) == {
        "a": ("succeeded", 0), "b": ("succeeded", 0), "c": ("succeeded", 0), "d": ("queued", 0)
    }  # fmt: skip
    assert _counters(queue, handle.id) == (4, 3, 0, 0, False)
    assert _finish_all(queue) == [handle.job_ids["d"]]
    assert _counters(queue, handle.id) == (4, 4, 0, 0, True)


@pytest.mark.parametrize("waiting", ["round", "add"], ids=["round-waits", "add-waits"])
def test_a_step_added_while_a_round_ends_its_upstream_is_released_and_its_workflow_goes_on(
    backend: Backend, waiting: str
):
    """Step ``r`` of workflow {a, r} adds ``late`` after ``a`` (and succeeds, in the same
    transaction) while a round ends ``a`` and ``x`` of another workflow {x → y}; one of them
    waits for the other's commit. A round that waited sees a workflow grown to three steps
    after its statement began: ``late`` must be released all the same and the workflow must
    not finish with two successes of three, while ``y`` beside it is released as ever.
    Broken, ``late`` would wait for ever, or its workflow finish early and strand it."""
    queue = _queue(backend)
    grown = _enqueue(queue, {"a": [], "r": []})
    other = _enqueue(queue, {"x": [], "y": ["x"]})
    claimed = {job.id: job for job in _claim(queue, "w")}
    a, r, x = (claimed[job_id] for job_id in (*grown.job_ids.values(), other.job_ids["x"]))
    add, round_ = _add_step(queue, grown.id, r, "late", ["a"]), _round(queue, "w", [a, x])
    if waiting == "round":
        late, landed = _race(queue, add, round_)
    else:
        landed, late = _race(queue, round_, add)
    assert landed == {a.id, x.id}
    assert _steps(queue, grown.id) == {
        "a": ("succeeded", 0), "r": ("succeeded", 0), "late": ("queued", 0)
    }  # fmt: skip
    assert _counters(queue, grown.id) == (3, 2, 0, 0, False)
    assert _steps(queue, other.id) == {"x": ("succeeded", 0), "y": ("queued", 0)}
    assert sorted(_finish_all(queue)) == sorted([late, other.job_ids["y"]])
    assert _counters(queue, grown.id) == (3, 3, 0, 0, True)
    assert _counters(queue, other.id) == (2, 2, 0, 0, True)


def _in_order(waiting: str, round_: Write, cancel_: Write) -> tuple[Write, Write]:
    """The held transaction, then the one that waits for it (``waiting``)."""
    return (round_, cancel_) if waiting == "cancel" else (cancel_, round_)


@pytest.mark.parametrize("waiting", ["cancel", "round"], ids=["cancel-waits", "round-waits"])
def test_a_batchs_last_child_and_a_cancel_of_its_sibling_enqueue_the_callback_once(
    backend: Backend, waiting: str
):
    """Child ``c1`` succeeds while an operator cancels ``c2``, the batch's other child; one
    waits for the other's commit and must then see both endings: ``on_complete`` is enqueued
    once and the batch finishes. Broken, no callback would come (each side counting only its
    own ending) or two would."""
    queue = _queue(backend)
    with queue.engine.begin() as conn:
        batch = queue.enqueue_batch(conn, [STEP, STEP], on_complete=JobRequest(job_type="done"))
    [c1] = _claim(queue, "w", limit=1)
    cancel_ = _cancel(queue, batch.job_ids[1])
    _race(queue, *_in_order(waiting, _round(queue, "w", [c1]), cancel_))
    assert _counters(queue, batch.id) == (2, 1, 0, 1, True)
    with queue.engine.connect() as conn:
        callbacks = conn.execute(sa.select(jobs.c.id).where(jobs.c.job_type == "done")).all()
        named = conn.execute(
            sa.select(batches.c.callback_job_id).where(batches.c.id == batch.id)
        ).scalar_one()
    assert [job_id for (job_id,) in callbacks] == [named]
    assert _finish_all(queue) == [named]


@pytest.mark.parametrize("waiting", ["cancel", "round"], ids=["cancel-waits", "round-waits"])
def test_a_steps_last_upstream_and_a_cancel_of_the_other_release_it_once(
    backend: Backend, waiting: str
):
    """Under ``on_dead="run"`` step ``d`` runs after ``a`` and ``c`` whatever their endings:
    ``a`` succeeds while an operator cancels ``c``, one waiting for the other's commit. ``d``
    is released once and runs once; the workflow counts one success, one cancel, then
    finishes. Broken, ``d`` would wait for ever, or run twice."""
    queue = _queue(backend)
    handle = _enqueue(queue, {"a": [], "c": [], "d": ["a", "c"]}, on_dead="run")
    [a] = _claim(queue, "w", limit=1)
    cancel_ = _cancel(queue, handle.job_ids["c"])
    _race(queue, *_in_order(waiting, _round(queue, "w", [a]), cancel_))
    assert _steps(queue, handle.id) == {
        "a": ("succeeded", 0), "c": ("cancelled", 0), "d": ("queued", 0)
    }  # fmt: skip
    assert _counters(queue, handle.id) == (3, 1, 0, 1, False)
    assert _finish_all(queue) == [handle.job_ids["d"]]
    assert _counters(queue, handle.id) == (3, 2, 0, 1, True)


def test_a_round_whose_lease_the_reaper_took_counts_and_releases_nothing_for_it(
    backend: Backend,
):
    """Worker ``w1``'s round ends ``a`` and ``c`` (``d`` runs after both) while the reaper,
    past ``a``'s lease, takes ``a`` back to retry it; the round waits for ``a``'s row. The
    fenced completion lands ``c`` alone: the workflow counts one success and ``d`` waits for
    ``a``'s next attempt, which then releases it once. Broken (a fence that did not re-read
    the row it waited for), ``a`` would count twice and ``d`` run before ``a`` had, the
    workflow finishing with ``a``'s retry still to run."""
    queue = _queue(backend)
    handle = _enqueue(queue, {"a": [], "c": [], "d": ["a", "c"]})
    [a] = _claim(queue, "w1", limit=1)
    [c] = _claim(queue, "w1", limit=1, lease_seconds=600)
    later = queue.store.database_now() + timedelta(seconds=120)  # a's lease is over, c's not

    def reap(conn: sa.Connection) -> tuple[list[int], list[int]]:
        return leases.reap_expired(conn, queue.dialect, limit=100, now=later)

    assert _race(queue, reap, _round(queue, "w1", [a, c])) == (([a.id], []), {c.id})
    assert _steps(queue, handle.id) == {
        "a": ("failed", 0), "c": ("succeeded", 0), "d": ("waiting", 1)
    }  # fmt: skip
    assert _counters(queue, handle.id) == (3, 1, 0, 0, False)
    [again] = _claim(queue, "w2", now=later)
    assert again.fence == (a.id, 2)
    landed = queue.store.finish(
        worker_id="w2", succeeded=[again.fence], failures=[], batch_ids=[handle.id]
    )
    assert landed == {a.id}
    assert _counters(queue, handle.id) == (3, 2, 0, 0, False)
    assert _finish_all(queue) == [handle.job_ids["d"]]
    assert _counters(queue, handle.id) == (3, 3, 0, 0, True)
