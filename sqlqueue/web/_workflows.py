"""Pages of workflows: the list, newest first (each with its counts, whether it finished and the
steps holding it up, read without its step rows), and a page per workflow: its graph drawn,
and its steps in topological order with each one's job, status, attempts, last error and the
steps it runs after. A dead step's requeue is on that page too: the same action as on the
job's page, which checks that the job is the workflow's step and comes back to the workflow
(a dead step of a finished workflow already requeued shows the job it was requeued as)."""

from __future__ import annotations

from collections.abc import Mapping

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from sqlqueue._digits import ascii_number
from sqlqueue._errors import JobStateError
from sqlqueue._job import TERMINAL, Job, JobStatus
from sqlqueue._workflow import WorkflowStatus
from sqlqueue.web._actions import checked, field, see
from sqlqueue.web._graph import draw
from sqlqueue.web._query import MAX_JOB_ID, job_list_filter
from sqlqueue.web._render import render
from sqlqueue.web._settings import WebSettings, settings_of

__all__ = ["STEPS_PER_PAGE", "WORKFLOWS_PER_PAGE", "requeue_step", "workflow_list", "workflow_page"]

#: Workflows per page of the list.
WORKFLOWS_PER_PAGE = 50
#: Steps per page of a workflow's table (the graph is drawn whole, or not at all).
STEPS_PER_PAGE = 200


def _viewer(request: Request) -> WebSettings:
    settings = settings_of(request)
    settings.require(request, "view")
    return settings


def _workflow_id(request: Request) -> int:
    """The path's workflow id; 404 for one no workflow can have."""
    workflow_id: int = request.path_params["workflow_id"]
    if not 1 <= workflow_id <= MAX_JOB_ID:
        raise HTTPException(404, f"there is no workflow {workflow_id}")
    return workflow_id


async def workflow_list(request: Request) -> Response:
    """The workflows, newest first, a page at a time, each with its counts by status, whether
    it finished and the steps holding it up."""
    settings = _viewer(request)
    before_id = job_list_filter(request.query_params).before_id
    found = await run_in_threadpool(
        lambda: settings.queue.workflows(limit=WORKFLOWS_PER_PAGE + 1, before_id=before_id)
    )
    shown = found[:WORKFLOWS_PER_PAGE]
    return render(
        request,
        "workflows.html",
        {
            "workflows": shown,
            "statuses": [status.value for status in JobStatus],
            "before_id": before_id,
            "next_before_id": shown[-1].id if len(found) > WORKFLOWS_PER_PAGE else None,
        },
    )


def _start(params: Mapping[str, str]) -> int:
    """The ``start`` parameter: the first step shown, counted in topological order from 0."""
    text = params.get("start", "").strip()
    if not text:
        return 0
    start = ascii_number(text, max_digits=9)
    if start is None:
        raise HTTPException(400, f"start must be a step's position (0, 200 …), got {text!r}")
    return start


def _read(
    settings: WebSettings, workflow_id: int, start: int
) -> tuple[WorkflowStatus | None, dict[int, Job]]:
    """The workflow and the jobs of the steps on the page (one read for all of them)."""
    queue = settings.queue
    workflow = queue.get_workflow(workflow_id)
    if workflow is None:
        return None, {}
    shown = list(workflow.steps.values())[start : start + STEPS_PER_PAGE]
    ids = [step.job_id for step in shown]
    found = queue.jobs(job_ids=ids, limit=len(ids)) if ids else []
    return workflow, {job.id: job for job in found}


async def workflow_page(request: Request) -> Response:
    """One workflow: its counts, its policy for dead steps, the steps holding it up, its graph
    and its steps in topological order."""
    settings = _viewer(request)
    workflow_id = _workflow_id(request)
    start = _start(request.query_params)
    workflow, found = await run_in_threadpool(_read, settings, workflow_id, start)
    if workflow is None:
        raise HTTPException(404, f"there is no workflow {workflow_id}")
    names = list(workflow.steps)
    if start and start >= len(names):
        raise HTTPException(400, f"start: the workflow has {len(names)} steps, got {start}")
    requeued = request.query_params.get("requeued", "")
    return render(
        request,
        "workflow.html",
        {
            "workflow": workflow,
            "total": len(names),
            "ended": sum(workflow.counts[status] for status in TERMINAL),
            "shown": [
                (name, workflow.steps[name], found.get(workflow.steps[name].job_id))
                for name in names[start : start + STEPS_PER_PAGE]
            ],
            "start": start,
            "previous_start": max(start - STEPS_PER_PAGE, 0) if start else None,
            "next_start": start + STEPS_PER_PAGE if start + STEPS_PER_PAGE < len(names) else None,
            "blocked": set(workflow.blocked_by),
            "drawing": draw(workflow),
            "statuses": [status.value for status in JobStatus],
            "requeued": ascii_number(requeued),
        },
    )


def _job_id(value: object) -> int:
    """A form's ``job_id``; 400 unless it is one."""
    text = value.strip() if isinstance(value, str) else ""
    job_id = ascii_number(text)
    if job_id is None or not 1 <= job_id <= MAX_JOB_ID:
        raise HTTPException(400, f"job_id must be a job id, got {str(value)[:40]!r}")
    return job_id


async def requeue_step(request: Request) -> Response:
    """Requeue the workflow's dead step named by its job (in an unfinished workflow the new
    job takes the step's place; in a finished one it runs on its own); back to the workflow.
    A job that is not the workflow's current step is refused (404), a step that is not dead
    too (409), and nothing changes."""
    settings, form = await checked(request, "requeue")
    workflow_id = _workflow_id(request)
    job_id = _job_id(form.get("job_id"))
    reason = field(form, "reason", "a reason")
    by = settings.who(request)
    queue = settings.queue

    def act() -> int:
        workflow = queue.get_workflow(workflow_id)
        if workflow is None:
            raise HTTPException(404, f"there is no workflow {workflow_id}")
        step = next((s for s in workflow.steps.values() if s.job_id == job_id), None)
        if step is None:
            raise HTTPException(404, f"job {job_id} is no step of workflow {workflow_id}")
        if step.status is not JobStatus.DEAD:
            raise JobStateError(f"job {job_id} is {step.status.value}; only dead steps requeue")
        return queue.requeue(job_id, by=by, reason=reason)

    new_id = await run_in_threadpool(act)
    return see(request, "workflow", {"requeued": new_id}, workflow_id=workflow_id)
