"""Reading workflows: a workflow's steps with their current jobs' statuses (in topological
order), the step a job is, and the results of a step's direct upstream steps (also for a job
requeued from a step after its workflow finished, which runs on its own)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, select

from sqlqueue._job import JobStatus
from sqlqueue._schema import batches, jobs, workflow_edges, workflow_steps
from sqlqueue._workflow import StepStatus, WorkflowStatus, topological_order

__all__ = ["read_workflow", "step_of", "upstream_results"]

_steps, _edges = workflow_steps, workflow_edges


def read_workflow(conn: Connection, workflow_id: int) -> WorkflowStatus | None:
    """Workflow ``workflow_id`` with each step's current job status, or ``None`` (no such
    workflow, or a plain batch)."""
    head = conn.execute(
        select(batches.c.created_at, batches.c.finished_at, batches.c.workflow_on_dead).where(
            batches.c.id == workflow_id
        )
    ).first()
    if head is None or head[2] is None:
        return None
    after: dict[str, list[str]] = {}
    for upstream, downstream in conn.execute(
        select(_edges.c.upstream, _edges.c.downstream).where(_edges.c.workflow_id == workflow_id)
    ):
        after.setdefault(str(downstream), []).append(str(upstream))
    rows = conn.execute(  # in job id order: the order the steps were written, ties kept
        select(_steps.c.name, _steps.c.job_id, jobs.c.status, jobs.c.result.is_not(None))
        .join(jobs, jobs.c.id == _steps.c.job_id)
        .where(_steps.c.workflow_id == workflow_id)
        .order_by(_steps.c.job_id)
    ).all()
    found = {
        str(name): (int(job_id), JobStatus(status), bool(has)) for name, job_id, status, has in rows
    }
    position = {name: index for index, name in enumerate(found)}
    graph = {
        name: tuple(
            sorted((up for up in after.get(name, []) if up in found), key=position.__getitem__)
        )
        for name in found
    }
    counts = dict.fromkeys(JobStatus, 0)
    steps: dict[str, StepStatus] = {}
    for name in topological_order(graph):
        job_id, status, has_result = found[name]
        counts[status] += 1
        steps[name] = StepStatus(
            job_id=job_id, status=status, after=graph[name], result_available=has_result
        )
    return WorkflowStatus(
        id=workflow_id,
        on_dead=str(head[2]),
        created_at=head[0],
        finished_at=head[1],
        steps=steps,
        counts=counts,
    )


def step_of(conn: Connection, job_id: int) -> tuple[int, str] | None:
    """``(workflow id, step name)`` of job ``job_id``, or ``None`` outside any workflow."""
    row = conn.execute(
        select(_steps.c.workflow_id, _steps.c.name).where(_steps.c.job_id == job_id)
    ).first()
    return None if row is None else (int(row[0]), str(row[1]))


def _step_requeued_from(conn: Connection, job_id: int) -> tuple[int, str] | None:
    """The step whose dead job job ``job_id`` was requeued from, following ``requeued_from``
    back (ids only go down, so the walk ends): a dead step requeued after its workflow
    finished keeps its dead job, and the new job, on its own, still reads what the step would
    have. ``None`` when no job it came from is a step (or retention pruned the way back)."""
    current: int | None = job_id
    while current is not None:
        current = conn.execute(select(jobs.c.requeued_from).where(jobs.c.id == current)).scalar()
        found = None if current is None else step_of(conn, current)
        if found is not None:
            return found
    return None


def upstream_results(conn: Connection, job_id: int) -> dict[str, Any]:
    """The stored results of the direct upstream steps of job ``job_id`` that succeeded, by
    step name (``None`` for one that stored none). Job ``job_id`` is a step's current job,
    or one requeued from a step's dead job after its workflow finished."""
    me = step_of(conn, job_id)
    if me is None:
        me = _step_requeued_from(conn, job_id)
    if me is None:
        return {}
    workflow_id, name = me
    upstream = _steps.alias("upstream")
    rows = conn.execute(
        select(upstream.c.name, jobs.c.result)
        .select_from(_edges)
        .join(
            upstream,
            (upstream.c.workflow_id == _edges.c.workflow_id)
            & (upstream.c.name == _edges.c.upstream),
        )
        .join(jobs, jobs.c.id == upstream.c.job_id)
        .where(
            _edges.c.workflow_id == workflow_id,
            _edges.c.downstream == name,
            jobs.c.status == "succeeded",
        )
    ).all()
    return {str(step): result for step, result in rows}
