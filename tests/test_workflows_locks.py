"""The order in which a workflow's rows are locked: every transaction takes the workflow's row
before any of its steps' rows (a worker round, a step added by a running step, a requeue of a
dead step), so two of them never wait on each other crosswise. Two real connections on the
backends with row locks."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

import sqlqueue
from sqlqueue import JobRequest, Workflow
from sqlqueue._schema import batches, jobs
from sqlqueue._store import cancel, counts, deadletter, job_actions, outcomes, workflows
from sqlqueue._store.batches import Endings, settle
from sqlqueue._store.filters import JobFilter
from sqlqueue._store.rows import Failure
from tests._support import wait_until
from tests._support.locks import session_id as _session_id
from tests._support.locks import waiting_for_a_lock as _waiting_for_a_lock
from tests.conftest import Backend


def test_a_requeue_of_a_dead_step_and_a_step_added_after_it_never_deadlock(backend: Backend):
    """A running step adds a step after a dead one while an operator requeues the dead one.
    The adding transaction holds the workflow's row and then locks the dead step's row; the
    requeue used to lock the step's row first (moving it to the new job) and then wait for the
    workflow's row: a lock cycle, which the server broke by aborting one of them. Now the
    requeue takes the workflow's row first and waits there holding no step, and both commit."""
    backend.requires("row_locks")
    queue = backend.queue()
    queue.task("step", max_attempts=1)(lambda: None)
    dialect = queue.dialect
    wf = Workflow()
    wf.add("a", JobRequest(job_type="step"))
    wf.add("b", JobRequest(job_type="step"), after=["a"])
    with queue.engine.begin() as conn:
        handle = queue.enqueue_workflow(conn, wf)
    [claimed] = queue.store.claim(
        queues=["default"], job_types=None, limit=5, worker_id="w", lease_seconds=60
    )
    dead = Failure(
        job_id=claimed.id, attempt=claimed.attempt, dead=True, retry_in=0.0, last_error="x",
        errors=[],
    )  # fmt: skip
    assert queue.store.finish(worker_id="w", succeeded=[], failures=[dead]) == {claimed.id}
    added_row = queue._workflow_row("added", JobRequest(job_type="step"))
    with queue.engine.begin() as conn:  # a requeue takes the finished counts' mark first
        counts.create_mark(conn, dialect)
    errors: list[BaseException] = []
    session: list[int] = []
    requeued: list[int] = []

    def requeue() -> None:
        try:
            with queue.engine.connect() as conn, conn.begin():
                session.append(_session_id(conn))
                requeued.append(
                    deadletter.requeue_one(
                        conn, dialect, job_id=claimed.id, by="ops", reason="try again"
                    )
                )
        except BaseException as error:
            errors.append(error)

    adding: Any = None
    with queue.engine.connect() as conn, conn.begin():
        # The adding transaction takes the workflow's row first, as add_step does.
        conn.execute(
            sa.select(batches.c.id).where(batches.c.id == handle.id).with_for_update()
        ).one()
        thread = threading.Thread(target=requeue, daemon=True)
        thread.start()
        try:
            wait_until(
                lambda: (
                    bool(errors or requeued)
                    or (bool(session) and _waiting_for_a_lock(queue.engine, session[0]))
                ),
                timeout=20,
                what="the requeue to wait for the workflow's row",
            )
            adding = workflows.add_step(
                conn, dialect, handle.id, name="c", row=added_row, after=["a"]
            )
        except BaseException as error:
            errors.append(error)
            raise
        finally:
            if errors:
                conn.rollback()
    thread.join(30)
    assert not thread.is_alive()
    assert errors == []
    assert adding is not None
    assert len(requeued) == 1
    status = queue.get_workflow(handle.id)
    assert status is not None
    assert status.steps["a"].job_id == requeued[0]  # the new job took the dead one's place
    assert status.steps["c"].after == ("a",)
    assert {name: str(step.status) for name, step in status.steps.items()} == {
        "a": "queued", "b": "waiting", "c": "waiting"
    }  # fmt: skip
    assert isinstance(status, sqlqueue.WorkflowStatus)


def _race(
    queue: sqlqueue.Queue,
    workflow_id: int,
    other: Callable[[sa.Connection], Any],
    ending: Callable[[sa.Connection], Any],
) -> tuple[list[Any], list[BaseException]]:
    """Hold workflow ``workflow_id``'s row on one connection (as :func:`batches.settle` takes
    it first) while ``other`` runs on another; once ``other`` waits for a lock (or is done),
    run ``ending`` in the holding transaction and commit. Returns what ``other`` returned and
    every error either side raised."""
    results: list[Any] = []
    errors: list[BaseException] = []
    session: list[int] = []

    def run_other() -> None:
        try:
            with queue.engine.connect() as conn, conn.begin():
                session.append(_session_id(conn))
                results.append(other(conn))
        except BaseException as error:
            errors.append(error)

    thread = threading.Thread(target=run_other, daemon=True)
    with queue.engine.connect() as conn, conn.begin():
        conn.execute(
            sa.select(batches.c.id).where(batches.c.id == workflow_id).with_for_update()
        ).one()
        thread.start()
        try:
            wait_until(
                lambda: (
                    bool(errors or results)
                    or (bool(session) and _waiting_for_a_lock(queue.engine, session[0]))
                ),
                timeout=20,
                what="the other transaction to wait for a lock",
            )
            ending(conn)
        except BaseException as error:
            errors.append(error)
            conn.rollback()
    thread.join(30)
    assert not thread.is_alive()
    return results, errors


def _end_first_step(queue: sqlqueue.Queue, status: str) -> Callable[[sa.Connection], Any]:
    """The first claimable step's ending, as a worker's round writes it: its fenced update,
    then :func:`batches.settle` (which releases, or cancels, the steps after it)."""
    [claimed] = queue.store.claim(
        queues=["default"], job_types=None, limit=5, worker_id="w", lease_seconds=60
    )

    def end(conn: sa.Connection) -> None:
        endings = Endings()
        if status == "succeeded":
            fence = (claimed.id, claimed.attempt)
            outcomes.complete(conn, queue.dialect, worker_id="w", fences=[fence], endings=endings)
        else:
            dead = Failure(
                job_id=claimed.id, attempt=claimed.attempt, dead=True, retry_in=0.0,
                last_error="x", errors=[],
            )  # fmt: skip
            assert outcomes.fail(conn, queue.dialect, worker_id="w", failure=dead, endings=endings)
        settle(conn, queue.dialect, endings)

    return end


def _cancel_one(job_id: int, dialect: Any) -> Callable[[sa.Connection], Any]:
    return lambda conn: cancel.cancel_job(conn, dialect, job_id).status


def _cancel_by_filter(job_id: int, dialect: Any) -> Callable[[sa.Connection], Any]:
    return lambda conn: (
        job_actions.cancel_batch(
            conn, dialect, JobFilter(job_ids=[job_id]), limit=10, record=None
        ).cancelled
    )


@pytest.mark.parametrize("cancel_with", [_cancel_one, _cancel_by_filter], ids=["one", "filter"])
def test_a_cancel_of_a_waiting_step_and_the_release_of_it_never_deadlock(
    backend: Backend, cancel_with: Callable[[int, Any], Callable[[sa.Connection], Any]]
):
    """An operator cancels step ``b`` while its only upstream ``a`` succeeds. The completion
    holds the workflow's row and then releases ``b`` (its job row); the cancel used to lock
    ``b``'s row first and then wait for the workflow's row to count the ending: a lock cycle,
    which PostgreSQL (40P01) and InnoDB (1213) broke by aborting one of them. Now the cancel
    of a waiting step takes the workflow's row first: it waits there holding nothing, and
    then cancels ``b``, released meanwhile."""
    backend.requires("row_locks")
    queue = backend.queue()
    queue.task("step", max_attempts=1)(lambda: None)
    wf = Workflow()
    wf.add("a", JobRequest(job_type="step"))
    wf.add("b", JobRequest(job_type="step"), after=["a"])
    with queue.engine.begin() as conn:
        handle = queue.enqueue_workflow(conn, wf)
    ending = _end_first_step(queue, "succeeded")
    _, errors = _race(queue, handle.id, cancel_with(handle.job_ids["b"], queue.dialect), ending)
    assert errors == []
    status = queue.get_workflow(handle.id)
    assert status is not None
    assert {name: str(step.status) for name, step in status.steps.items()} == {
        "a": "succeeded", "b": "cancelled"
    }  # fmt: skip
    assert status.finished


@pytest.mark.parametrize("cancel_with", [_cancel_one, _cancel_by_filter], ids=["one", "filter"])
def test_a_cancel_of_a_waiting_step_and_its_workflow_cancelling_it_never_deadlock(
    backend: Backend, cancel_with: Callable[[int, Any], Callable[[sa.Connection], Any]]
):
    """Under ``on_dead="cancel"`` step ``a`` goes dead while an operator cancels ``c`` (after
    ``b``, after ``a``). The dead ending holds the workflow's row and cancels ``b`` and ``c``;
    the operator's cancel used to hold ``c``'s row and wait for the workflow's: a lock cycle.
    Now it waits for the workflow's row first and finds ``c`` cancelled already (by the
    workflow: the operator is told it is no longer cancellable)."""
    backend.requires("row_locks")
    queue = backend.queue()
    queue.task("step", max_attempts=1)(lambda: None)
    wf = Workflow(on_dead="cancel")
    wf.add("a", JobRequest(job_type="step"))
    wf.add("b", JobRequest(job_type="step"), after=["a"])
    wf.add("c", JobRequest(job_type="step"), after=["b"])
    with queue.engine.begin() as conn:
        handle = queue.enqueue_workflow(conn, wf)
    ending = _end_first_step(queue, "dead")
    results, errors = _race(
        queue, handle.id, cancel_with(handle.job_ids["c"], queue.dialect), ending
    )
    assert all(isinstance(error, sqlqueue.JobStateError) for error in errors), errors
    assert results in ([], [[]])  # the one-job cancel says why; the filter finds nothing to do
    status = queue.get_workflow(handle.id)
    assert status is not None
    assert {name: str(step.status) for name, step in status.steps.items()} == {
        "a": "dead", "b": "cancelled", "c": "cancelled"
    }  # fmt: skip
    assert status.finished
    with queue.engine.connect() as conn:  # the workflow's row counted each once
        counted = conn.execute(
            sa.select(batches.c.dead, batches.c.cancelled).where(batches.c.id == handle.id)
        ).one()
    assert tuple(counted) == (1, 2)


def test_a_cancel_by_filter_goes_on_past_a_step_its_workflow_ended_meanwhile(backend: Backend):
    """``cancel_where`` with batches of two reads waiting step ``s1`` and queued job ``p1``
    and waits for ``s1``'s workflow's row, which a dead ending of ``up`` holds while it
    cancels ``s1`` (``on_dead="cancel"``). The batch then cancels only ``p1``: one short
    batch used to end the cancel, leaving five matching jobs queued. And the queued job past
    the batch's cut (``p2``, after the older step) is not held while it waits: a claim may
    take it."""
    backend.requires("row_locks")
    queue = backend.queue()
    queue.task("step", max_attempts=1)(lambda: None)
    wf = Workflow(on_dead="cancel")
    wf.add("up", JobRequest(job_type="step"))
    wf.add("s1", JobRequest(job_type="step", queue="q"), after=["up"])
    with queue.engine.begin() as conn:
        handle = queue.enqueue_workflow(conn, wf)
    plain = [queue.enqueue(queue.engine, "step", queue="q") for _ in range(6)]
    ending = _end_first_step(queue, "dead")
    results: list[int] = []
    errors: list[BaseException] = []

    def cancel_where() -> None:
        try:
            results.append(queue.cancel_where(queue="q", batch_size=2))
        except BaseException as error:
            errors.append(error)

    thread = threading.Thread(target=cancel_where, daemon=True)
    holding = threading.Event()

    def note_hold(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        # The cancel's thread asks for the workflows' rows, its candidates read and its queued
        # jobs locked (a statement hook: InnoDB does not always show this wait as LOCK WAIT).
        asks = "sqlqueue_batches" in statement and "FOR UPDATE" in statement
        if asks and threading.get_ident() == thread.ident:
            holding.set()

    sa.event.listen(queue.engine, "before_cursor_execute", note_hold)
    free: list[int] = []
    with queue.engine.connect() as conn, conn.begin():
        conn.execute(
            sa.select(batches.c.id).where(batches.c.id == handle.id).with_for_update()
        ).one()
        thread.start()
        try:
            wait_until(
                lambda: bool(errors or results) or holding.is_set(),
                timeout=20,
                what="the cancel to ask for the workflow's row",
            )
            with queue.engine.connect() as claim, claim.begin():  # as a claim reads them
                free = list(
                    claim.execute(
                        queue.dialect.skip_locked(
                            sa.select(jobs.c.id).where(jobs.c.id.in_(plain)).order_by(jobs.c.id)
                        )
                    ).scalars()
                )
            ending(conn)
        except BaseException:
            conn.rollback()
            raise
    thread.join(30)
    assert not thread.is_alive()
    assert errors == []
    assert free == plain[1:]  # only p1, in the batch, was locked while the cancel waited
    assert results == [6]
    with queue.engine.connect() as conn:
        left = conn.execute(
            sa.select(sa.func.count()).where(jobs.c.queue == "q", jobs.c.status != "cancelled")
        ).scalar_one()
    assert left == 0
    status = queue.get_workflow(handle.id)
    assert status is not None
    assert {name: str(step.status) for name, step in status.steps.items()} == {
        "up": "dead", "s1": "cancelled"
    }  # fmt: skip
