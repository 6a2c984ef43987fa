"""What bad input to a workflow is told, before any SQL: a graph with no steps, a step after
no step, a cycle, a step added twice or after itself, a step with an idempotency key or of a
unique task (on every path: sync, async, added by a running step), a step of an unknown type;
and property tests (Hypothesis) of the graph check and of step names. Every backend."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import given
from hypothesis import strategies as st

import sqlqueue
from sqlqueue import JobRequest, Workflow, WorkflowError
from tests._support import count_jobs, drain
from tests._support.workflows import diamond as _diamond
from tests._support.workflows import enqueue_workflow as _enqueue
from tests._support.workflows import step_queue as _queue
from tests._support.workflows import step_request as _step
from tests._support.workflows import workflow_status as _status


@contextmanager
def _statements(engine: sa.Engine) -> Iterator[list[str]]:
    sent: list[str] = []

    def record(*args: Any) -> None:
        sent.append(str(args[2]))

    sa.event.listen(engine, "before_cursor_execute", record)
    try:
        yield sent
    finally:
        sa.event.remove(engine, "before_cursor_execute", record)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda wf: None, "at least one step"),
        (lambda wf: wf.add("a", _step("a"), after=["nope"]), "'nope', which is no step"),
        (
            lambda wf: (wf.add("a", _step("a"), after=["b"]), wf.add("b", _step("b"), after=["a"])),
            "form a cycle",
        ),
    ],
)
def test_a_bad_graph_is_refused_when_enqueued_before_any_sql(backend, build, message):
    queue, _ = _queue(backend)
    wf = Workflow()
    build(wf)
    with _statements(queue.engine) as sent, queue.engine.connect() as conn:
        with pytest.raises(WorkflowError, match=message):
            queue.enqueue_workflow(conn, wf)
        assert sent == []
    assert count_jobs(queue.engine) == 0


def test_bad_steps_are_refused_as_they_are_added():
    wf = Workflow()
    wf.add("a", _step("a"))
    with pytest.raises(WorkflowError, match="step 'a' is already in this workflow"):
        wf.add("a", _step("again"))
    with pytest.raises(WorkflowError, match="cannot run after itself"):
        wf.add("b", _step("b"), after=["b"])
    with pytest.raises(WorkflowError, match="must be a list of step names"):
        wf.add("c", _step("c"), after="a")
    with pytest.raises(WorkflowError, match="has an idempotency_key"):
        wf.add("d", JobRequest(job_type="step", idempotency_key="k"))
    with pytest.raises(WorkflowError, match="a unique job cannot be a workflow step"):
        wf.add("u", JobRequest(job_type="step", unique=sqlqueue.Unique(by=("label",))))
    with pytest.raises(WorkflowError, match="a non-empty str"):
        wf.add("", _step("e"))
    with pytest.raises(WorkflowError, match="on_dead must be one of wait, cancel, run"):
        Workflow(on_dead="retry")  # type: ignore[arg-type]
    assert issubclass(WorkflowError, sqlqueue.EnqueueError)


def test_a_step_of_a_unique_task_is_refused_on_every_path_before_any_sql(backend):
    """Two workflows with a step of a task unique by ``n`` and a plain enqueue of the same key
    once wrote three jobs with one key: a step is refused (sync, async, added by a running
    step), and the plain enqueue alone holds the key."""
    queue, _ = _queue(backend)
    refused: list[str] = []

    @queue.task("once", unique=sqlqueue.Unique(by=("n",)))
    def once(n: int) -> None:
        pass

    @queue.task("adder", max_attempts=1)
    def adder(ctx: sqlqueue.JobContext) -> None:
        try:
            ctx.add_to_workflow("late", JobRequest(job_type="once", payload={"n": 1}))
        except WorkflowError as error:
            refused.append(str(error))

    def unique_step() -> Workflow:
        wf = Workflow()
        wf.add("a", _step("a"))
        wf.add("once", JobRequest(job_type="once", payload={"n": 1}), after=["a"])
        return wf

    for _ in range(2):
        with _statements(queue.engine) as sent, queue.engine.connect() as conn:
            with pytest.raises(WorkflowError, match="a unique job cannot be a workflow step"):
                queue.enqueue_workflow(conn, unique_step())
            assert sent == []

    async def enqueue_async() -> None:
        engine = queue.async_engine()
        try:
            async with engine.connect() as conn:
                await queue.enqueue_workflow_async(conn, unique_step())
        finally:
            await engine.dispose()

    with pytest.raises(WorkflowError, match="'once' \\(once\\) is unique"):
        asyncio.run(enqueue_async())
    with queue.engine.begin() as conn:
        queue.enqueue(conn, "once", {"n": 1})
    wf = Workflow()
    wf.add("adder", JobRequest(job_type="adder"))
    handle = _enqueue(queue, wf)
    drain(queue)
    assert len(refused) == 1
    assert "a unique job cannot be a workflow step" in refused[0]
    assert list(_status(queue, handle.id).steps) == ["adder"]
    assert count_jobs(queue.engine) == 2  # the plain "once" and the adder


def test_a_step_of_an_unknown_type_writes_nothing(backend):
    queue, _ = _queue(backend)
    wf = _diamond()
    wf.add("e", JobRequest(job_type="nobody.knows"), after=["d"])
    with queue.engine.begin() as conn, pytest.raises(sqlqueue.UnknownJobType):
        queue.enqueue_workflow(conn, wf)
    assert count_jobs(queue.engine) == 0


@given(st.lists(st.lists(st.integers(min_value=0, max_value=15), max_size=4), min_size=1,
                max_size=16))  # fmt: skip
def test_any_graph_is_either_ordered_upstreams_first_or_refused_as_a_cycle(edges):
    """Step n runs after the steps named in ``edges[n]`` (an index past the end: no such step):
    the check orders every acyclic graph so each step follows its upstreams, and refuses any
    other with WorkflowError, before anything is sent."""
    wf = Workflow()
    for n, after in enumerate(edges):
        wf.add(f"s{n}", _step(f"s{n}"), after=sorted({f"s{up}" for up in after if up != n}))
    try:
        order = wf.order()
    except WorkflowError as error:
        refusal = str(error)
    else:
        refusal = ""
    if refusal:
        assert "cycle" in refusal or "which is no step" in refusal
        return
    position = {name: index for index, name in enumerate(order)}
    assert sorted(order) == sorted(f"s{n}" for n in range(len(edges)))
    for name, upstreams in wf.after.items():
        assert all(position[up] < position[name] for up in upstreams)


@given(st.text(max_size=210))
def test_a_step_name_is_taken_or_refused_with_workflow_error(name):
    wf = Workflow()
    try:
        added = wf.add(name, _step("x"))
    except WorkflowError as error:
        added = str(error)
        assert "step name" in added
    else:
        assert added == name
