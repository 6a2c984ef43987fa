"""What a step's handler sees of its workflow: ``ctx.workflow`` (None outside one), and
``ctx.add_to_workflow`` / ``ctx.add_to_workflow_async``: the workflow waits for the steps a
running step adds, a step added after an ended step follows the ``on_dead`` policy, a step
that adds steps and then fails leaves none of them, and a bad call says why (so does
``ctx.add_to_batch`` in a step, which would add a job with no step). Every backend."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import sqlqueue
from sqlqueue import JobRequest, JobStatus, Workflow
from tests._support import count_jobs, drain
from tests._support.workflows import enqueue_workflow as _enqueue
from tests._support.workflows import fix_payload as _fix_payload
from tests._support.workflows import step_queue as _queue
from tests._support.workflows import step_request as _step
from tests._support.workflows import step_statuses as _statuses
from tests._support.workflows import workflow_status as _status


def test_ctx_workflow_is_the_steps_workflow_and_none_outside_one(backend):
    queue = backend.queue()
    seen: list[Any] = []

    @queue.task("look")
    def look(ctx: sqlqueue.JobContext) -> None:
        seen.append((ctx.workflow, dict(ctx.upstream_results)))

    wf = Workflow()
    wf.add("one", JobRequest(job_type="look"))
    handle = _enqueue(queue, wf)
    with queue.engine.begin() as conn:
        queue.enqueue(conn, "look")
    drain(queue)
    (inside,) = [status for status, _ in seen if status is not None]
    assert len(seen) == 2
    assert inside.id == handle.id
    assert inside.steps["one"].status is JobStatus.RUNNING


def test_a_running_step_adds_steps_and_the_workflow_waits_for_them(backend):
    queue, seen = _queue(backend)
    wf = Workflow()
    wf.add("g", JobRequest(job_type="grow", payload={"label": "g"}))
    wf.add("tail", _step("tail"), after=["g"])
    handle = _enqueue(queue, wf)
    drain(queue)
    results = dict(seen)
    assert results["added"] == {"g": "g"}
    assert results["free"] == {}
    status = _status(queue, handle.id)
    assert set(status.steps) == {"g", "tail", "added", "free"}
    assert status.steps["added"].after == ("g",)
    assert status.succeeded
    assert status.finished_at is not None
    assert queue.get_batch(handle.id).total == 4  # type: ignore[union-attr]


@pytest.mark.parametrize("on_dead", ["wait", "cancel", "run"])
def test_a_step_added_after_an_ended_step_follows_the_policy(backend, on_dead):
    """Steps added by a running step after a dead step (``x``), a cancelled one (``z``) and one
    that succeeded (``y``): the succeeded one counts as done at once; the others as the
    policy says, never a wait that nothing ends (the cancel policy once left them waiting)."""
    queue, seen = _queue(backend)

    @queue.task("adder", max_attempts=1)
    def adder(ctx: sqlqueue.JobContext) -> None:
        for name, upstream in (("x", "a"), ("z", "c"), ("y", "ok")):
            ctx.add_to_workflow(name, _step(name), after=[upstream])

    wf = Workflow(on_dead=on_dead)
    wf.add("a", _step("a", fail=True))
    wf.add("ok", _step("ok"))
    wf.add("c", JobRequest(job_type="step", payload={"label": "c"}, queue="later"))
    wf.add("adder", JobRequest(job_type="adder", queue="last"))
    handle = _enqueue(queue, wf)
    queue.cancel(handle.job_ids["c"], by="ops", reason="not needed")
    drain(queue)  # "a" dies, "ok" succeeds
    drain(queue, queues=["last"])  # the steps are added after them
    drain(queue)
    statuses = _statuses(queue, handle.id)
    results = dict(seen)
    status = _status(queue, handle.id)
    assert statuses["y"] == "succeeded"
    assert results["y"] == {"ok": "result of ok"}
    if on_dead == "cancel":
        assert (statuses["x"], statuses["z"]) == ("cancelled", "cancelled")
        reason = queue.get_job(status.steps["x"].job_id).last_error  # type: ignore[union-attr]
        assert reason is not None
        assert "on_dead='cancel'" in reason
        assert "'a'" in reason
        assert "x" not in results
        assert status.finished
        assert status.finished_at is not None
        assert queue.get_batch(handle.id).cancelled == 3  # type: ignore[union-attr]
    elif on_dead == "run":
        assert (statuses["x"], statuses["z"]) == ("succeeded", "succeeded")
        assert (results["x"], results["z"]) == ({}, {})
        assert status.finished
        assert status.finished_at is not None
    else:
        assert (statuses["x"], statuses["z"]) == ("waiting", "waiting")
        assert sorted(status.blocked_by) == ["a", "c"]
        assert not status.finished
        _fix_payload(queue, handle.job_ids["a"], "a")
        queue.requeue(handle.job_ids["a"], by="ops", reason="fixed the payload")
        drain(queue)
        assert results != dict(seen)
        assert dict(seen)["x"] == {"a": "result of a"}
        assert _status(queue, handle.id).blocked_by == ("c",)
    if on_dead != "wait":
        assert status.blocked_by == ()


def test_an_async_step_adds_steps_with_add_to_workflow_async(backend):
    queue, seen = _queue(backend)

    @queue.task("grow_async", max_attempts=1)
    async def grow_async(ctx: sqlqueue.JobContext) -> str:
        added = await ctx.add_to_workflow_async("added", _step("added"), after=["g"])
        assert (await ctx.add_to_workflow_async("free", _step("free"))) > added
        return "grown"

    wf = Workflow()
    wf.add("g", JobRequest(job_type="grow_async"))
    wf.add("tail", _step("tail"), after=["g"])
    handle = _enqueue(queue, wf)
    drain(queue)
    asyncio.run(queue.async_engine().dispose())  # its connections die with the worker's loop
    results = dict(seen)
    assert results["added"] == {"g": "grown"}
    assert results["free"] == {}
    status = _status(queue, handle.id)
    assert set(status.steps) == {"g", "tail", "added", "free"}
    assert status.succeeded
    assert queue.get_batch(handle.id).total == 4  # type: ignore[union-attr]


def test_a_step_that_adds_steps_then_fails_leaves_none_of_them(backend):
    queue, seen = _queue(backend)

    @queue.task("grow_then_fail", max_attempts=1)
    def grow_then_fail(ctx: sqlqueue.JobContext) -> None:
        ctx.add_to_workflow("added", _step("added"), after=["g"])
        ctx.add_to_workflow("free", _step("free"))
        raise RuntimeError("failed after adding")

    wf = Workflow(on_dead="run")
    wf.add("g", JobRequest(job_type="grow_then_fail"))
    wf.add("tail", _step("tail"), after=["g"])
    handle = _enqueue(queue, wf)
    drain(queue)
    assert _statuses(queue, handle.id) == {"g": "dead", "tail": "succeeded"}
    assert [label for label, _ in seen] == ["tail"]
    assert queue.get_batch(handle.id).total == 2  # type: ignore[union-attr]
    assert count_jobs(queue.engine) == 2
    assert _status(queue, handle.id).finished_at is not None


def test_add_to_workflow_outside_a_workflow_or_with_a_known_name_says_why(backend):
    queue = backend.queue()
    errors: list[str] = []

    @queue.task("try_add", max_attempts=1)
    def try_add(name: str, ctx: sqlqueue.JobContext) -> None:
        try:
            ctx.add_to_workflow(name, JobRequest(job_type="try_add", payload={"name": "x"}),
                                after=["nope"] if name == "ghost" else [])  # fmt: skip
        except sqlqueue.JobStateError as error:
            errors.append(str(error))

    with queue.engine.begin() as conn:
        queue.enqueue(conn, "try_add", {"name": "lone"})
    wf = Workflow()
    wf.add("first", JobRequest(job_type="try_add", payload={"name": "first"}))
    wf.add("second", JobRequest(job_type="try_add", payload={"name": "ghost"}))
    handle = _enqueue(queue, wf)
    drain(queue)
    assert any("is not a workflow step" in error for error in errors)
    assert any("step 'first' is already in workflow" in error for error in errors)
    assert any("has no step 'nope'" in error for error in errors)
    assert _status(queue, handle.id).succeeded
    assert set(_status(queue, handle.id).steps) == {"first", "second"}


@pytest.mark.parametrize("handler", ["sync", "async"])
def test_add_to_batch_in_a_step_is_refused_and_points_to_add_to_workflow(backend, handler):
    """A workflow is stored as a batch, but a child added by ``add_to_batch`` would have no step
    row: the workflow's total would count a job that its steps never show, so it is refused
    before anything is written, saying what to call instead."""
    queue, _ = _queue(backend)
    errors: list[str] = []

    @queue.task("fan", max_attempts=1)
    def fan(ctx: sqlqueue.JobContext) -> str:
        try:
            ctx.add_to_batch([_step("stray")])
        except sqlqueue.JobStateError as error:
            errors.append(str(error))
        return "fanned"

    @queue.task("afan", max_attempts=1)
    async def afan(ctx: sqlqueue.JobContext) -> str:
        try:
            await ctx.add_to_batch_async([_step("stray")])
        except sqlqueue.JobStateError as error:
            errors.append(str(error))
        return "fanned"

    wf = Workflow()
    wf.add("fan", JobRequest(job_type="fan" if handler == "sync" else "afan"))
    wf.add("tail", _step("tail"), after=["fan"])
    handle = _enqueue(queue, wf)
    drain(queue)
    asyncio.run(queue.async_engine().dispose())  # its connections die with the worker's loop
    (error,) = errors
    assert f"is a step of workflow {handle.id}" in error
    assert "ctx.add_to_workflow(name, request, after=[...])" in error
    assert count_jobs(queue.engine) == 2
    assert _statuses(queue, handle.id) == {"fan": "succeeded", "tail": "succeeded"}
    status = _status(queue, handle.id)
    assert status.finished_at is not None
    assert queue.get_batch(handle.id).total == 2  # type: ignore[union-attr]
