"""Workflows as the tests/test_workflows_*.py files build them: a queue whose ``step`` handler
records what each step saw (and a ``grow`` handler that adds steps), step requests, a diamond,
enqueueing one, reading its status back, and fixing a dead step's payload before a requeue.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

import sqlqueue
from sqlqueue import JobRequest, Workflow
from sqlqueue._schema import jobs
from tests.conftest import Backend

__all__ = [
    "Seen",
    "diamond",
    "enqueue_workflow",
    "fix_payload",
    "step_queue",
    "step_request",
    "step_statuses",
    "workflow_status",
]

#: What the step handlers saw: (step label, its upstream results) in the order they ran.
Seen = list[tuple[str, dict[str, Any]]]


def step_queue(backend: Backend, **options: Any) -> tuple[sqlqueue.Queue, Seen]:
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
        ctx.add_to_workflow("added", step_request("added"), after=[label])
        ctx.add_to_workflow("free", step_request("free"))
        return label

    return queue, seen


def step_request(label: str, **payload: Any) -> JobRequest:
    return JobRequest(job_type="step", payload={"label": label, **payload})


def diamond(**options: Any) -> Workflow:
    wf = Workflow(**options)
    wf.add("a", step_request("a"))
    wf.add("b", step_request("b"), after=["a"])
    wf.add("c", step_request("c"), after=["a"])
    wf.add("d", step_request("d"), after=["b", "c"])
    return wf


def enqueue_workflow(queue: sqlqueue.Queue, wf: Workflow) -> sqlqueue.WorkflowHandle:
    with queue.engine.begin() as conn:
        return queue.enqueue_workflow(conn, wf)


def workflow_status(queue: sqlqueue.Queue, workflow_id: int) -> sqlqueue.WorkflowStatus:
    status = queue.get_workflow(workflow_id)
    assert status is not None, f"workflow {workflow_id} vanished"
    return status


def step_statuses(queue: sqlqueue.Queue, workflow_id: int) -> dict[str, str]:
    return {name: str(s.status) for name, s in workflow_status(queue, workflow_id).steps.items()}


def fix_payload(queue: sqlqueue.Queue, job_id: int, label: str) -> None:
    """What an operator does before requeueing a dead step: fix what made it fail."""
    with queue.engine.begin() as conn:
        conn.execute(sa.update(jobs).where(jobs.c.id == job_id).values(payload={"label": label}))
