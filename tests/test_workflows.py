"""Workflows: steps that wait for other steps, released exactly once in the transaction that
ends their last upstream, whatever ended it (a worker, the reaper, an operator); results handed
down; the three ``on_dead`` policies; requeue, cancel, discard and retention; steps added by a
running step; and what bad input is told, before any SQL. Every backend; real worker processes
with a SIGKILL are in tests/test_workflows_processes.py."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

import sqlqueue
from sqlqueue import JobRequest, JobStatus, Workflow, WorkflowError
from sqlqueue._schema import batches, jobs, workflow_edges, workflow_steps
from sqlqueue._store import batches as store_batches
from sqlqueue._store import outcomes
from sqlqueue._store.filters import JobFilter
from tests._support import WorkerThread, count_jobs, drain, wait_until
from tests._support import run_cli as cli
from tests.conftest import Backend

#: What the step handlers saw: (step label, its upstream results) in the order they ran.
Seen = list[tuple[str, dict[str, Any]]]


def _queue(backend: Backend, **options: Any) -> tuple[sqlqueue.Queue, Seen]:
    queue = backend.queue(**options)
    seen: Seen = []

    @queue.task("step", max_attempts=1)
    def step(label: str, ctx: sqlqueue.JobContext, fail: bool = False) -> str:
        seen.append((label, dict(ctx.upstream_results)))
        if fail:
            raise ValueError(f"step {label} fails")
        return f"result of {label}"

    @queue.task("grow", max_attempts=1)
    def grow(label: str, ctx: sqlqueue.JobContext) -> str:
        seen.append((label, dict(ctx.upstream_results)))
        ctx.add_to_workflow("added", _step("added"), after=[label])
        ctx.add_to_workflow("free", _step("free"))
        return label

    return queue, seen


def _step(label: str, **payload: Any) -> JobRequest:
    return JobRequest(job_type="step", payload={"label": label, **payload})


def _diamond(**options: Any) -> Workflow:
    wf = Workflow(**options)
    wf.add("a", _step("a"))
    wf.add("b", _step("b"), after=["a"])
    wf.add("c", _step("c"), after=["a"])
    wf.add("d", _step("d"), after=["b", "c"])
    return wf


def _enqueue(queue: sqlqueue.Queue, wf: Workflow) -> sqlqueue.WorkflowHandle:
    with queue.engine.begin() as conn:
        return queue.enqueue_workflow(conn, wf)


def _status(queue: sqlqueue.Queue, workflow_id: int) -> sqlqueue.WorkflowStatus:
    status = queue.get_workflow(workflow_id)
    assert status is not None, f"workflow {workflow_id} vanished"
    return status


def _statuses(queue: sqlqueue.Queue, workflow_id: int) -> dict[str, str]:
    return {name: str(s.status) for name, s in _status(queue, workflow_id).steps.items()}


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


# -- writing a workflow -------------------------------------------------------------------------


def test_a_workflow_is_written_with_its_steps_waiting_on_their_upstreams(backend):
    queue, _ = _queue(backend)
    handle = _enqueue(queue, _diamond())
    assert isinstance(handle, sqlqueue.WorkflowHandle)
    assert list(handle.job_ids) == ["a", "b", "c", "d"]
    status = _status(queue, handle.id)
    assert list(status.steps) == ["a", "b", "c", "d"]  # topological order
    assert _statuses(queue, handle.id) == {
        "a": "queued", "b": "waiting", "c": "waiting", "d": "waiting"
    }  # fmt: skip
    assert status.steps["d"].after == ("b", "c")
    assert status.steps["a"].job_id == handle.job_ids["a"]
    assert status.counts[JobStatus.WAITING] == 3
    assert set(status.counts) == set(JobStatus)
    assert (status.finished, status.succeeded, status.finished_at) == (False, False, None)
    assert queue.get_job(handle.job_ids["d"]).status is JobStatus.WAITING  # type: ignore[union-attr]
    stats = queue.stats()
    assert stats.by_status["waiting"] == 3
    assert stats.queues["default"].by_status["waiting"] == 3
    assert queue.get_workflow(handle.id + 1000) is None


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


def test_a_workflow_goes_through_a_session_an_engine_and_rolls_back_whole(backend):
    queue, _ = _queue(backend)
    with Session(queue.engine) as session, session.begin():
        kept = queue.enqueue_workflow(session, _diamond())
    by_engine = queue.enqueue_workflow(queue.engine, _diamond())
    with queue.engine.connect() as conn, conn.begin() as transaction:
        dropped = queue.enqueue_workflow(conn, _diamond())
        transaction.rollback()
    assert _status(queue, kept.id).counts[JobStatus.WAITING] == 3
    assert _status(queue, by_engine.id).counts[JobStatus.QUEUED] == 1
    assert queue.get_workflow(dropped.id) is None
    assert count_jobs(queue.engine) == 8


def test_enqueue_workflow_async(backend):
    queue, _ = _queue(backend)

    async def main() -> tuple[sqlqueue.WorkflowHandle, sqlqueue.WorkflowHandle]:
        engine = queue.async_engine()
        try:
            async with engine.begin() as conn:
                kept = await queue.enqueue_workflow_async(conn, _diamond())
            async with AsyncSession(engine) as session:
                dropped = await queue.enqueue_workflow_async(session, _diamond())
                await session.rollback()
            with pytest.raises(WorkflowError):
                async with engine.begin() as conn:
                    await queue.enqueue_workflow_async(conn, Workflow())
            return kept, dropped
        finally:
            await engine.dispose()

    kept, dropped = asyncio.run(main())
    assert len(_status(queue, kept.id).steps) == 4
    assert queue.get_workflow(dropped.id) is None
    assert count_jobs(queue.engine) == 4


# -- running it ---------------------------------------------------------------------------------


def test_a_diamond_runs_in_order_and_each_step_reads_its_upstreams_results(backend):
    queue, seen = _queue(backend)
    handle = _enqueue(queue, _diamond())
    drain(queue)
    order = [label for label, _ in seen]
    assert order[0] == "a"
    assert order[-1] == "d"
    assert sorted(order[1:3]) == ["b", "c"]
    results = dict(seen)
    assert results["a"] == {}
    assert results["b"] == {"a": "result of a"}
    assert results["d"] == {"b": "result of b", "c": "result of c"}
    status = _status(queue, handle.id)
    assert (status.finished, status.succeeded, status.blocked_by) == (True, True, ())
    assert status.finished_at is not None
    assert all(step.result_available for step in status.steps.values())
    assert status.counts[JobStatus.SUCCEEDED] == 4


def test_a_chain_runs_one_step_after_another(backend):
    queue, seen = _queue(backend)
    wf = Workflow()
    previous: list[str] = []
    for n in range(6):
        previous = [wf.add(f"s{n}", _step(f"s{n}"), after=previous)]
    handle = _enqueue(queue, wf)
    drain(queue)
    assert [label for label, _ in seen] == [f"s{n}" for n in range(6)]
    assert _status(queue, handle.id).succeeded


def test_a_fan_in_releases_its_step_once_when_the_last_upstream_ends(backend):
    queue, seen = _queue(backend)
    wf = Workflow()
    parts = [wf.add(f"p{n}", _step(f"p{n}")) for n in range(40)]
    wf.add("join", _step("join"), after=parts)
    handle = _enqueue(queue, wf)
    drain(queue, concurrency=4)
    joined = [results for label, results in seen if label == "join"]
    assert len(joined) == 1
    assert joined[0] == {f"p{n}": f"result of p{n}" for n in range(40)}
    assert _status(queue, handle.id).succeeded


def test_two_upstreams_ending_in_concurrent_transactions_release_the_join_once(backend):
    """B and C of a diamond end in two open transactions: the second waits on the workflow's
    row (a row lock; SQLite's one writer) until the first commits, then sees D's count reach
    zero and alone releases it."""
    queue, _ = _queue(backend)
    wf = Workflow()
    wf.add("b", _step("b"))
    wf.add("c", _step("c"))
    wf.add("d", _step("d"), after=["b", "c"])
    handle = _enqueue(queue, wf)
    first, second = (
        queue.store.claim(
            queues=["default"], job_types=None, limit=1, worker_id=worker, lease_seconds=60
        )[0]
        for worker in ("w1", "w2")
    )
    assert {first.id, second.id} == {handle.job_ids["b"], handle.job_ids["c"]}
    dialect = queue.store.dialect
    with queue.store.engine.connect() as conn:
        dialect.begin_write(conn)
        endings = store_batches.Endings()
        outcomes.complete(conn, dialect, worker_id="w1", fences=[first.fence], endings=endings)
        store_batches.settle(conn, dialect, endings)
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
    assert _statuses(queue, handle.id)["d"] == "queued"
    with queue.engine.connect() as conn:
        row = conn.execute(
            sa.select(workflow_steps.c.waiting_on).where(workflow_steps.c.name == "d")
        ).scalar_one()
    assert row == 0  # decremented once by each upstream, never twice


def test_a_step_that_completes_in_its_own_transaction_releases_in_it(backend):
    queue = backend.queue()
    notes = sa.Table("wf_notes", sa.MetaData(), sa.Column("label", sa.String(20)))
    notes.create(queue.engine)

    @queue.task("write")
    def write(label: str, ctx: sqlqueue.JobContext) -> None:
        with ctx.transaction() as conn:
            conn.execute(notes.insert().values(label=label))

    wf = Workflow()
    wf.add("first", JobRequest(job_type="write", payload={"label": "first"}))
    wf.add("second", JobRequest(job_type="write", payload={"label": "second"}), after=["first"])
    handle = _enqueue(queue, wf)
    drain(queue)
    assert _status(queue, handle.id).succeeded
    with queue.engine.connect() as conn:
        assert sorted(conn.execute(sa.select(notes.c.label)).scalars()) == ["first", "second"]


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


# -- dead and cancelled steps --------------------------------------------------------------------


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


def _fix_payload(queue: sqlqueue.Queue, job_id: int, label: str) -> None:
    """What an operator does before requeueing a dead step: fix what made it fail."""
    with queue.engine.begin() as conn:
        conn.execute(sa.update(jobs).where(jobs.c.id == job_id).values(payload={"label": label}))


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


def test_cancelling_a_waiting_step_blocks_under_wait_and_its_workflow_can_end(backend):
    queue, _ = _queue(backend)
    handle = _enqueue(queue, _diamond())
    cancelled = queue.cancel(handle.job_ids["b"], by="ops", reason="not needed")
    assert cancelled.status is JobStatus.CANCELLED
    drain(queue)
    assert _statuses(queue, handle.id) == {
        "a": "succeeded", "b": "cancelled", "c": "succeeded", "d": "waiting"
    }  # fmt: skip
    assert _status(queue, handle.id).blocked_by == ("b",)
    queue.cancel(handle.job_ids["d"])
    status = _status(queue, handle.id)
    assert status.finished
    assert status.finished_at is not None


def test_cancel_by_filter_applies_the_cancel_policy(backend):
    queue, _ = _queue(backend)
    handle = _enqueue(queue, _diamond(on_dead="cancel"))
    assert queue.cancel_where(job_ids=[handle.job_ids["a"]]) == 1
    assert _statuses(queue, handle.id) == dict.fromkeys("abcd", "cancelled")
    assert _status(queue, handle.id).finished_at is not None


@pytest.mark.parametrize("by", ["job_type", "queue"])
def test_cancel_by_type_or_queue_applies_the_cancel_policy(backend, by):
    queue, seen = _queue(backend)
    queue.task("fetch", max_attempts=1)(lambda: None)
    wf = Workflow(on_dead="cancel")
    wf.add("fetch", JobRequest(job_type="fetch", queue="inbound"))
    wf.add("other", _step("other"))
    wf.add("parse", _step("parse"), after=["fetch"])
    wf.add("store", _step("store"), after=["parse", "other"])
    handle = _enqueue(queue, wf)
    filters: dict[str, Any] = {"job_type": "fetch"} if by == "job_type" else {"queue": "inbound"}
    assert queue.cancel_where(**filters, by="ops", reason="feed retired") == 1
    assert _statuses(queue, handle.id) == {
        "fetch": "cancelled", "other": "queued", "parse": "cancelled", "store": "cancelled"
    }  # fmt: skip
    reason = queue.get_job(handle.job_ids["store"]).last_error  # type: ignore[union-attr]
    assert reason is not None
    assert "'fetch'" in reason
    drain(queue)
    assert [label for label, _ in seen] == ["other"]
    assert _status(queue, handle.id).finished_at is not None


@pytest.mark.parametrize("batch_size", [1, 2, 3, 100])
def test_cancel_by_filter_takes_waiting_steps_and_queued_jobs_in_any_batch_size(
    backend, batch_size
):
    """Waiting steps and queued jobs interleaved by id: every batch takes the oldest of both,
    and the cancel goes on until the filter matches nothing (each job once)."""
    queue, _ = _queue(backend)
    plain: list[int] = []
    steps: list[int] = []
    ups: list[int] = []
    for _ in range(3):
        plain.append(queue.enqueue(queue.engine, "step", {"label": "p"}, queue="q"))
        wf = Workflow()
        wf.add("up", JobRequest(job_type="step", payload={"label": "up"}, queue="other"))
        wf.add("s1", JobRequest(job_type="step", payload={"label": "s"}, queue="q"), after=["up"])
        wf.add("s2", JobRequest(job_type="step", payload={"label": "s"}, queue="q"), after=["up"])
        handle = _enqueue(queue, wf)
        steps += [handle.job_ids["s1"], handle.job_ids["s2"]]
        ups.append(handle.job_ids["up"])
    plain.append(queue.enqueue(queue.engine, "step", {"label": "p"}, queue="q"))
    first = queue.admin.cancel_batch(JobFilter(queue="q"), limit=batch_size, record=None)
    assert first.cancelled == sorted(plain + steps)[:batch_size]
    matching = len(plain) + len(steps)
    assert first.exhausted is (batch_size > matching)
    assert queue.cancel_where(queue="q", batch_size=batch_size) == matching - len(first.cancelled)
    with queue.engine.connect() as conn:
        rows = dict(conn.execute(sa.select(jobs.c.id, jobs.c.status)).all())
    assert {rows[job_id] for job_id in plain + steps} == {"cancelled"}
    assert {rows[job_id] for job_id in ups} == {"queued"}
    assert queue.cancel_where(queue="q", batch_size=batch_size) == 0


def test_discarding_a_dead_step_keeps_the_steps_after_it_waiting(backend):
    queue, _ = _queue(backend)
    wf = Workflow()
    wf.add("a", _step("a", fail=True))
    wf.add("b", _step("b"), after=["a"])
    handle = _enqueue(queue, wf)
    drain(queue)
    queue.discard(handle.job_ids["a"], by="ops", reason="handled by hand")
    assert _statuses(queue, handle.id) == {"a": "dead", "b": "waiting"}
    assert not _status(queue, handle.id).finished
    queue.cancel(handle.job_ids["b"], by="ops", reason="handled by hand")
    assert _status(queue, handle.id).finished_at is not None


def test_the_reaper_giving_up_on_a_step_applies_the_policy(backend):
    queue, _ = _queue(backend, lease_seconds=0.2)
    wf = Workflow(on_dead="cancel")
    wf.add("a", _step("a"))
    wf.add("b", _step("b"), after=["a"])
    handle = _enqueue(queue, wf)
    queue.store.claim(queues=["default"], job_types=None, limit=1, worker_id="gone",
                      lease_seconds=0.2)  # fmt: skip
    wait_until(lambda: bool(queue.store.reap_expired()[1]), timeout=10, what="the reaper")
    assert _statuses(queue, handle.id) == {"a": "dead", "b": "cancelled"}


def test_a_step_that_times_out_on_its_last_attempt_blocks_the_steps_after_it(backend):
    queue = backend.queue()

    @queue.task("sleepy", max_attempts=1, timeout=0.2)
    async def sleepy() -> None:
        await asyncio.sleep(30)

    @queue.task("after")
    def after() -> None:
        pass

    wf = Workflow()
    wf.add("sleepy", JobRequest(job_type="sleepy"))
    wf.add("after", JobRequest(job_type="after"), after=["sleepy"])
    handle = _enqueue(queue, wf)
    drain(queue)
    assert _statuses(queue, handle.id) == {"sleepy": "dead", "after": "waiting"}


# -- retention and growth -----------------------------------------------------------------------


def test_retention_keeps_the_steps_of_an_unfinished_workflow_then_forgets_it_whole(backend):
    queue, _ = _queue(backend)
    wf = Workflow()
    wf.add("a", _step("a"))
    wf.add("b", _step("b", fail=True), after=["a"])
    wf.add("c", _step("c"), after=["b"])
    handle = _enqueue(queue, wf)
    drain(queue)
    assert queue.prune(older_than=0, statuses=["succeeded", "dead"]) == 0
    assert _statuses(queue, handle.id) == {"a": "succeeded", "b": "dead", "c": "waiting"}
    queue.cancel(handle.job_ids["c"])
    assert _status(queue, handle.id).finished
    wait_until(
        lambda: (
            queue.prune(older_than=0, statuses=["succeeded", "dead", "cancelled"]) == 0
            and count_jobs(queue.engine) == 0
        ),
        what="the finished workflow's steps pruned",
    )
    assert queue.get_workflow(handle.id) is None
    with queue.engine.connect() as conn:
        for table in (batches, workflow_steps, workflow_edges):
            assert conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one() == 0


def test_the_retention_duty_keeps_an_unfinished_workflows_steps(backend):
    """A worker's Retention (batched prunes; on PostgreSQL the move into the history too)
    passes over the ended steps of an unfinished workflow while it prunes a plain job beside
    them; once the workflow finishes, its steps go too."""
    retention = sqlqueue.Retention(succeeded=0, dead=0, cancelled=0, interval=0.05, history_after=0)
    queue, _ = _queue(backend, retention=retention)
    wf = Workflow()
    wf.add("a", _step("a"))
    wf.add("b", _step("b", fail=True), after=["a"])
    wf.add("c", _step("c"), after=["b"])
    handle = _enqueue(queue, wf)
    ended = {"a": "succeeded", "b": "dead", "c": "waiting"}
    with WorkerThread(queue.worker(poll_interval=0.02)):
        wait_until(lambda: _statuses(queue, handle.id) == ended, what="the steps to end")
        with queue.engine.begin() as conn:  # pruned by passes that also see the ended steps
            plain = [
                queue.enqueue(conn, "step", {"label": "plain", "fail": fail})
                for fail in (False, True)
            ]
        wait_until(
            lambda: all(queue.get_job(job_id) is None for job_id in plain),
            what="the duty to prune the plain jobs",
        )
        assert _statuses(queue, handle.id) == ended
        assert queue.get_job(handle.job_ids["a"]).result == "result of a"  # type: ignore[union-attr]
        queue.cancel(handle.job_ids["c"])
        wait_until(lambda: count_jobs(queue.engine) == 0, what="the finished workflow pruned")
    assert queue.get_workflow(handle.id) is None


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


# -- operators ----------------------------------------------------------------------------------


def test_workflow_show_lists_the_steps_in_order_and_jobs_show_names_the_workflow(backend):
    queue, _ = _queue(backend)
    wf = Workflow()
    wf.add("charge", _step("charge"))
    wf.add("mail", _step("mail", fail=True), after=["charge"])
    wf.add("done", _step("done"), after=["mail"])
    handle = _enqueue(queue, wf)
    drain(queue)
    text = cli("workflow", "show", str(handle.id), url=backend.url)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].startswith(f"workflow {handle.id} (on_dead=wait), finished: -")
    assert lines[1] == "blocked by: mail"
    body = "\n".join(lines[2:])
    assert body.index("charge") < body.index("mail") < body.index("done")
    assert "step mail fails" in body
    shown = cli("workflow", "show", str(handle.id), "--json", url=backend.url)
    document = json.loads(shown.stdout)
    assert list(document["steps"]) == ["charge", "mail", "done"]
    assert document["steps"]["mail"]["status"] == "dead"
    assert document["steps"]["mail"]["attempts"] == 1
    assert "step mail fails" in document["steps"]["mail"]["last_error"]
    assert document["steps"]["done"]["after"] == ["mail"]
    assert document["blocked_by"] == ["mail"]
    job_text = cli("jobs", "show", str(handle.job_ids["mail"]), url=backend.url).stdout
    assert f"workflow:         {handle.id}, step 'mail'" in job_text
    job_json = json.loads(
        cli("jobs", "show", str(handle.job_ids["mail"]), "--json", url=backend.url).stdout
    )
    assert job_json["workflow"] == {"id": handle.id, "step": "mail", "replaced_by": None}
    new_id = queue.requeue(handle.job_ids["mail"], by="ops", reason="try again")
    old_text = cli("jobs", "show", str(handle.job_ids["mail"]), url=backend.url).stdout
    assert f"workflow:         {handle.id}, step 'mail', replaced there by job {new_id}" in old_text
    old_json = json.loads(
        cli("jobs", "show", str(handle.job_ids["mail"]), "--json", url=backend.url).stdout
    )
    assert old_json["workflow"] == {"id": handle.id, "step": "mail", "replaced_by": new_id}
    waiting = cli("jobs", "list", "--status", "waiting", "--json", url=backend.url)
    assert waiting.returncode == 0, waiting.stderr
    assert [job["id"] for job in json.loads(waiting.stdout)] == [handle.job_ids["done"]]
    listed = cli("jobs", "list", "--status", "waiting", url=backend.url).stdout
    assert str(handle.job_ids["done"]) in listed
    assert "waiting" in listed
    missing = cli("workflow", "show", "999999", url=backend.url)
    assert (missing.returncode, missing.stderr.strip()) == (
        1,
        "sqlqueue: error: there is no workflow 999999",
    )


# -- properties of the graph check (outside input) ------------------------------------------------


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
