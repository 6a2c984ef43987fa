"""The ``on_dead`` policies, whatever ended the step: under ``wait`` a dead step blocks the
steps after it until an operator's requeue takes its place; ``cancel`` cancels them with the
reason; ``run`` runs them without the dead step's result, and a requeued dead step never
releases a step twice. The same when the reaper gives up on a step, when a step times out on
its last attempt, or when it expires. Every backend."""

from __future__ import annotations

import asyncio

import pytest
import sqlalchemy as sa

import sqlqueue
from sqlqueue import JobRequest, JobStatus, Workflow
from sqlqueue._schema import workflow_steps
from tests._support import drain, wait_until
from tests._support.workflows import enqueue_workflow as _enqueue
from tests._support.workflows import fix_payload as _fix_payload
from tests._support.workflows import step_queue as _queue
from tests._support.workflows import step_request as _step
from tests._support.workflows import step_statuses as _statuses
from tests._support.workflows import workflow_status as _status

#: Every ``on_dead`` policy, for the tests that each path ending a step applies all of them.
ON_DEAD = ["wait", "cancel", "run"]


def _assert_fate_after(
    queue: sqlqueue.Queue,
    handle: sqlqueue.WorkflowHandle,
    *,
    dead: str,
    after: list[str],
    on_dead: str,
) -> None:
    """The steps ``after`` dead step ``dead`` met the fate ``on_dead`` gives
    them: ``wait``, still waiting with ``blocked_by`` naming it; ``cancel``, cancelled with
    the reason naming it and the policy; ``run``, run and succeeded (drained here)."""
    if on_dead == "run":
        drain(queue)
    fate = {"wait": "waiting", "cancel": "cancelled", "run": "succeeded"}[on_dead]
    assert _statuses(queue, handle.id) == {dead: "dead", **dict.fromkeys(after, fate)}
    status = _status(queue, handle.id)
    assert status.blocked_by == ((dead,) if on_dead == "wait" else ())
    assert status.finished is (on_dead != "wait")
    assert (status.finished_at is not None) is status.finished
    if on_dead == "cancel":
        for name in after:
            reason = queue.get_job(handle.job_ids[name]).last_error  # type: ignore[union-attr]
            assert reason is not None
            assert f"{dead!r}" in reason
            assert "on_dead='cancel'" in reason


def test_on_dead_wait_blocks_then_an_operator_requeue_takes_the_place_and_finishes(backend):
    queue, seen = _queue(backend)
    wf = Workflow()
    wf.add("a", _step("a", fail=True))
    wf.add("b", _step("b"), after=["a"])
    handle = _enqueue(queue, wf)
    drain(queue)
    status = _status(queue, handle.id)
    assert _statuses(queue, handle.id) == {"a": "dead", "b": "waiting"}
    assert (status.finished, status.blocked_by) == (False, ("a",))
    _fix_payload(queue, handle.job_ids["a"], "a")
    new_id = queue.requeue(handle.job_ids["a"], by="ops", reason="fixed the payload")
    assert _status(queue, handle.id).steps["a"].job_id == new_id
    drain(queue)
    status = _status(queue, handle.id)
    assert status.succeeded
    assert status.finished_at is not None
    assert seen[-1] == ("b", {"a": "result of a"})


def test_on_dead_cancel_cancels_every_step_after_the_dead_one_with_the_reason(backend):
    queue, seen = _queue(backend)
    wf = Workflow(on_dead="cancel")
    wf.add("a", _step("a"))
    wf.add("b", _step("b", fail=True), after=["a"])
    wf.add("c", _step("c"), after=["a"])
    wf.add("d", _step("d"), after=["b", "c"])
    wf.add("e", _step("e"), after=["d"])
    handle = _enqueue(queue, wf)
    drain(queue)
    assert _statuses(queue, handle.id) == {
        "a": "succeeded", "b": "dead", "c": "succeeded", "d": "cancelled", "e": "cancelled"
    }  # fmt: skip
    status = _status(queue, handle.id)
    assert status.finished
    assert not status.succeeded
    assert status.finished_at is not None
    reason = queue.get_job(handle.job_ids["e"]).last_error  # type: ignore[union-attr]
    assert reason is not None
    assert "'b'" in reason
    assert "on_dead='cancel'" in reason
    assert {label for label, _ in seen} == {"a", "b", "c"}


def test_on_dead_run_runs_the_steps_after_without_the_dead_ones_result(backend):
    queue, seen = _queue(backend)
    wf = Workflow(on_dead="run")
    wf.add("a", _step("a", fail=True))
    wf.add("b", _step("b"))
    wf.add("c", _step("c"), after=["a", "b"])
    wf.add("d", _step("d"), after=["c", "a"])
    handle = _enqueue(queue, wf)
    drain(queue)
    results = dict(seen)
    assert results["c"] == {"b": "result of b"}
    assert results["d"] == {"c": "result of c"}
    status = _status(queue, handle.id)
    assert status.finished
    assert not status.succeeded
    # A requeue of the dead step is not counted a second time in the steps after it.
    with queue.engine.connect() as conn:
        waits = dict(
            conn.execute(
                sa.select(workflow_steps.c.name, workflow_steps.c.waiting_on).where(
                    workflow_steps.c.workflow_id == handle.id
                )
            ).all()
        )
    assert waits == {"a": 0, "b": 0, "c": 0, "d": 0}


def test_on_dead_run_a_cancelled_upstream_releases_the_steps_after_it(backend):
    queue, seen = _queue(backend)
    wf = Workflow(on_dead="run")
    wf.add("a", JobRequest(job_type="step", payload={"label": "a"}, queue="later"))
    wf.add("b", _step("b"))
    wf.add("c", _step("c"), after=["a", "b"])
    handle = _enqueue(queue, wf)
    queue.cancel(handle.job_ids["a"], by="ops", reason="not needed")
    drain(queue)
    assert _statuses(queue, handle.id) == {"a": "cancelled", "b": "succeeded", "c": "succeeded"}
    assert dict(seen)["c"] == {"b": "result of b"}
    status = _status(queue, handle.id)
    assert (status.finished, status.blocked_by) == (True, ())
    assert status.finished_at is not None


def test_on_dead_run_a_requeued_dead_step_never_releases_a_step_twice(backend):
    queue, seen = _queue(backend)
    wf = Workflow(on_dead="run")
    wf.add("a", _step("a", fail=True))
    wf.add("slow", JobRequest(job_type="step", payload={"label": "slow"}, queue="later"))
    wf.add("join", _step("join"), after=["a", "slow"])
    handle = _enqueue(queue, wf)
    drain(queue, queues=["default"])  # "a" dies; "slow" has not run
    _fix_payload(queue, handle.job_ids["a"], "a")
    queue.requeue(handle.job_ids["a"], by="ops", reason="fixed the payload")
    drain(queue, queues=["default"])  # the requeued "a" succeeds: counted once already
    assert _statuses(queue, handle.id) == {"a": "succeeded", "slow": "queued", "join": "waiting"}
    drain(queue, queues=["default", "later"])
    assert [label for label, _ in seen].count("join") == 1
    assert _status(queue, handle.id).succeeded


@pytest.mark.parametrize("on_dead", ON_DEAD)
def test_a_dead_step_requeued_after_its_workflow_finished_runs_on_its_own(backend, on_dead):
    """The batches' rule for a finished batch: once a workflow has finished (under ``cancel``
    and ``run`` by itself, under ``wait`` once an operator cancelled the waiting steps), a
    requeue of its dead step leaves it as it was — the step keeps its dead job, and the
    steps, counts, ``finished`` and ``finished_at`` still agree — while the new job runs on
    its own (it keeps the workflow's id for lineage, and reads the dead step's upstream
    results), releasing and cancelling nothing."""
    queue, seen = _queue(backend)
    wf = Workflow(on_dead=on_dead)
    wf.add("root", _step("root"))
    wf.add("a", _step("a", fail=True), after=["root"])
    wf.add("b", _step("b"), after=["a"])
    handle = _enqueue(queue, wf)
    drain(queue)
    if on_dead == "wait":
        queue.cancel(handle.job_ids["b"], by="ops", reason="gave up on it")
    finished = _status(queue, handle.id)
    summary = queue.workflow_summary(handle.id)
    assert finished.finished
    assert finished.finished_at is not None
    assert finished.counts[JobStatus.DEAD] == 1
    _fix_payload(queue, handle.job_ids["a"], "a")
    new_id = queue.requeue(handle.job_ids["a"], by="ops", reason="run it anyway")
    assert _status(queue, handle.id) == finished
    assert queue.workflow_summary(handle.id) == summary
    drain(queue)
    assert _status(queue, handle.id) == finished
    assert queue.workflow_summary(handle.id) == summary
    new = queue.get_job(new_id)
    assert new is not None
    assert (new.status, new.batch_id, new.requeued_from) == (
        JobStatus.SUCCEEDED, handle.id, handle.job_ids["a"]
    )  # fmt: skip
    assert seen[-1] == ("a", {"root": "result of root"})
    assert [label for label, _ in seen].count("b") == (1 if on_dead == "run" else 0)


@pytest.mark.parametrize("on_dead", ON_DEAD)
def test_the_reaper_giving_up_on_a_step_applies_the_policy(backend, on_dead):
    queue, seen = _queue(backend)  # the claim below sets the short lease; drains keep theirs
    wf = Workflow(on_dead=on_dead)
    wf.add("a", _step("a"))
    wf.add("b", _step("b"), after=["a"])
    handle = _enqueue(queue, wf)
    queue.store.claim(queues=["default"], job_types=None, limit=1, worker_id="gone",
                      lease_seconds=0.2)  # fmt: skip
    wait_until(lambda: bool(queue.store.reap_expired()[1]), timeout=10, what="the reaper")
    _assert_fate_after(queue, handle, dead="a", after=["b"], on_dead=on_dead)
    assert [label for label, _ in seen] == (["b"] if on_dead == "run" else [])


@pytest.mark.parametrize("on_dead", ON_DEAD)
def test_a_step_that_times_out_on_its_last_attempt_applies_the_policy(backend, on_dead):
    queue = backend.queue()
    ran: list[str] = []

    @queue.task("sleepy", max_attempts=1, timeout=0.2)
    async def sleepy() -> None:
        await asyncio.sleep(30)

    @queue.task("after")
    def after() -> None:
        ran.append("after")

    wf = Workflow(on_dead=on_dead)
    wf.add("sleepy", JobRequest(job_type="sleepy"))
    wf.add("after", JobRequest(job_type="after"), after=["sleepy"])
    handle = _enqueue(queue, wf)
    drain(queue)
    _assert_fate_after(queue, handle, dead="sleepy", after=["after"], on_dead=on_dead)
    assert ran == (["after"] if on_dead == "run" else [])


def test_a_step_that_expires_is_cancelled_and_on_dead_cancel_cancels_the_steps_after_it(backend):
    from datetime import UTC, datetime, timedelta

    from sqlqueue._store.expiry import expire_jobs

    queue, seen = _queue(backend)
    wf = Workflow(on_dead="cancel")
    past = datetime.now(UTC) - timedelta(days=1)
    wf.add("a", JobRequest(job_type="step", payload={"label": "a"}, expires_at=past))
    wf.add("b", _step("b"), after=["a"])
    handle = _enqueue(queue, wf)
    with queue.engine.begin() as conn:
        assert expire_jobs(conn, queue.dialect) == 1
    # What an operator sees: the expired step cancelled, the step after it cancelled with it,
    # the workflow finished — none of them ran.
    assert _statuses(queue, handle.id) == {"a": "cancelled", "b": "cancelled"}
    assert _status(queue, handle.id).finished
    assert seen == []
