"""Writing a workflow: ``enqueue_workflow`` writes each step waiting on its upstreams (the
first steps queued), and ``get_workflow`` reads the WorkflowStatus back in topological order
with its counts; through a connection, a Session or an engine, sync or async, and a rolled
back transaction leaves nothing of it. Every backend."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

import sqlqueue
from sqlqueue import JobStatus, Workflow, WorkflowError
from tests._support import count_jobs
from tests._support.workflows import diamond as _diamond
from tests._support.workflows import enqueue_workflow as _enqueue
from tests._support.workflows import step_queue as _queue
from tests._support.workflows import step_statuses as _statuses
from tests._support.workflows import workflow_status as _status


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
