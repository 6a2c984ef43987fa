"""Listing workflows for operators: a page of workflows, newest first, each with its counts by
status and the steps holding it up — in two statements per page, whatever the workflows' sizes.

The counts come as a batch's do (a workflow is a batch row with ``workflow_on_dead`` set): the
terminal ones from the row's counters, the live ones counted in the jobs' batch index, and only
for unfinished workflows (a finished one's counters are final). The steps holding a workflow up
are read only for the workflows on the page that can have one (``on_dead="wait"``, unfinished,
a dead or cancelled step and a waiting one), starting from their dead and cancelled jobs: the
read never walks a workflow's step rows or edges beyond those jobs' own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, RowMapping, case, func, select

from sqlqueue._job import JobStatus
from sqlqueue._schema import batches, jobs, workflow_edges, workflow_steps
from sqlqueue._workflow_summary import WorkflowSummary

__all__ = ["read_workflow_summaries"]

#: The terminal statuses counted on the workflow's row, each in the column of the same name.
_COUNTED = ("succeeded", "dead", "cancelled")
#: The statuses of steps on their way, counted from the jobs' batch index when unfinished.
_LIVE = ("queued", "running", "failed", "waiting")
#: What a step holding others up ended as.
_STOPPED = ("dead", "cancelled")


def _live_count(status: str) -> Any:
    """Jobs of the row's workflow in ``status``; 0 without a count once it finished."""
    count = (
        select(func.count())
        .select_from(jobs)
        .where(jobs.c.batch_id == batches.c.id, jobs.c.status == status)
        .scalar_subquery()
    )
    return case((batches.c.finished_at.is_(None), count), else_=0).label(status)


def read_workflow_summaries(
    conn: Connection,
    *,
    limit: int,
    before_id: int | None = None,
    workflow_id: int | None = None,
) -> list[WorkflowSummary]:
    """The newest ``limit`` workflows with ids below ``before_id`` (or workflow
    ``workflow_id`` alone), each with its counts and the steps holding it up."""
    query = (
        select(
            batches.c.id,
            batches.c.total,
            batches.c.created_at,
            batches.c.finished_at,
            batches.c.workflow_on_dead,
            *(batches.c[status] for status in _COUNTED),
            *(_live_count(status) for status in _LIVE),
        )
        .where(batches.c.workflow_on_dead.is_not(None))
        .order_by(batches.c.id.desc())
        .limit(limit)
    )
    if before_id is not None:
        query = query.where(batches.c.id < before_id)
    if workflow_id is not None:
        query = query.where(batches.c.id == workflow_id)
    rows = conn.execute(query).mappings().all()
    held = _blocked_by(conn, [int(row["id"]) for row in rows if _may_be_blocked(row)])
    return [_summary(row, held.get(int(row["id"]), ())) for row in rows]


def _may_be_blocked(row: RowMapping) -> bool:
    """Whether the workflow can have steps held up: only these are asked which."""
    return (
        row["workflow_on_dead"] == "wait"
        and row["finished_at"] is None
        and row["waiting"] > 0
        and row["dead"] + row["cancelled"] > 0
    )


def _blocked_by(conn: Connection, workflow_ids: Sequence[int]) -> dict[int, tuple[str, ...]]:
    """The dead or cancelled current steps of ``workflow_ids`` with a waiting step after them,
    by workflow, names sorted: from the workflows' dead and cancelled jobs (the batch index),
    each one's step (a requeued dead job is no step's any more), and whether one of its edges
    out leads to a waiting step — asked per step (``EXISTS`` on the edges' key), so a big
    workflow's other steps and waiting jobs are never read."""
    if not workflow_ids:
        return {}
    upstream, downstream = workflow_steps.alias("upstream"), workflow_steps.alias("downstream")
    later = jobs.alias("later")
    waits_after = (
        select(workflow_edges.c.downstream)
        .join(
            downstream,
            (downstream.c.workflow_id == workflow_edges.c.workflow_id)
            & (downstream.c.name == workflow_edges.c.downstream),
        )
        .join(later, later.c.id == downstream.c.job_id)
        .where(
            workflow_edges.c.workflow_id == upstream.c.workflow_id,
            workflow_edges.c.upstream == upstream.c.name,
            later.c.status == "waiting",
        )
        .exists()
    )
    query = (
        select(upstream.c.workflow_id, upstream.c.name)
        .select_from(jobs)
        .join(upstream, upstream.c.job_id == jobs.c.id)
        .where(jobs.c.batch_id.in_(workflow_ids), jobs.c.status.in_(_STOPPED), waits_after)
    )
    found: dict[int, list[str]] = {}
    for workflow_id, name in conn.execute(query):
        found.setdefault(int(workflow_id), []).append(str(name))
    return {workflow_id: tuple(sorted(names)) for workflow_id, names in found.items()}


def _summary(row: RowMapping, blocked_by: tuple[str, ...]) -> WorkflowSummary:
    counts = {JobStatus(status): int(row[status]) for status in (*_COUNTED, *_LIVE)}
    return WorkflowSummary(
        id=int(row["id"]),
        on_dead=str(row["workflow_on_dead"]),
        total=int(row["total"]),
        counts={status: counts[status] for status in JobStatus},
        created_at=row["created_at"],
        finished_at=row["finished_at"],
        blocked_by=blocked_by,
    )
