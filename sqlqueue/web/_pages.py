"""The pages (GET only; nothing here changes a job): the overview, its chart fragment, the job
list and one job. Each reads through the operations API in a worker thread, never blocking the
event loop on the database."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from sqlqueue._batch import BatchStatus
from sqlqueue._digits import ascii_number
from sqlqueue._job import Job, JobStatus
from sqlqueue._job_action import JobAction
from sqlqueue._operators.stats import Activity, Health
from sqlqueue._workflow_summary import WorkflowSummary
from sqlqueue.web._chart import chart_of
from sqlqueue.web._query import MAX_JOB_ID, job_list_filter
from sqlqueue.web._render import render
from sqlqueue.web._settings import WebSettings, settings_of

__all__ = ["PAGE_SIZE", "chart", "job_list", "job_page", "overview"]

#: Jobs per page of the list.
PAGE_SIZE = 50
#: Minutes the chart covers.
CHART_MINUTES = 60


async def _reads(settings: WebSettings) -> tuple[Health, Activity]:
    """The overview's two reads, side by side in two threads (each on its own connection): the
    page waits for the longer, not for both — stats with their alarms, and the chart's hour."""
    queue = settings.queue
    return await asyncio.gather(
        run_in_threadpool(lambda: queue.health(max_queued_age=settings.max_queued_age)),
        run_in_threadpool(lambda: queue.activity(minutes=CHART_MINUTES)),
    )


def _viewer(request: Request) -> WebSettings:
    """The app's settings, once ``authorize`` lets the request view (403 otherwise)."""
    settings = settings_of(request)
    settings.require(request, "view")
    return settings


async def overview(request: Request) -> Response:
    """Counts by status per queue and job type, ages, recent failures, top errors, paused
    queues and the last hour's chart."""
    settings = _viewer(request)
    health, activity = await _reads(settings)
    return render(
        request,
        "overview.html",
        {
            "health": health,
            "stats": health.stats,
            "statuses": [status.value for status in JobStatus],
            "chart": chart_of(activity),
            "activity": activity,
            "max_queued_age": settings.max_queued_age,
        },
    )


async def chart(request: Request) -> Response:
    """The chart alone: what the overview's script fetches to refresh it."""
    settings = _viewer(request)
    activity = await run_in_threadpool(settings.queue.activity, minutes=CHART_MINUTES)
    return render(request, "_chart.html", {"chart": chart_of(activity), "activity": activity})


async def job_list(request: Request) -> Response:
    """Jobs matching the query's filters, newest first, a page at a time (keyset paging)."""
    settings = _viewer(request)
    wanted = job_list_filter(request.query_params)
    queue = settings.queue

    def read() -> list[Job]:  # one more than a page: is there an older page at all?
        return queue.jobs(
            status=wanted.status,
            job_type=wanted.job_type,
            queue=wanted.queue,
            error_contains=wanted.error,
            since=wanted.since_moment(queue),
            unhandled=wanted.unhandled,
            tag=wanted.tag,
            before_id=wanted.before_id,
            limit=PAGE_SIZE + 1,
        )

    found = await run_in_threadpool(read)
    jobs = found[:PAGE_SIZE]
    notice = {
        key: request.query_params[key]
        for key in ("requeued", "discarded", "cancelled")
        if ascii_number(request.query_params.get(key, "")) is not None
    }
    return render(
        request,
        "jobs.html",
        {
            "jobs": jobs,
            "wanted": wanted,
            "statuses": [status.value for status in JobStatus],
            "next_before_id": jobs[-1].id if len(found) > PAGE_SIZE else None,
            "notice": notice,
        },
    )


@dataclass(frozen=True, kw_only=True)
class _JobReads:
    """What a job's page shows besides the job: its workflow (a step's) or else its batch, with
    their counts, and what operators did to it."""

    workflow: WorkflowSummary | None = None
    batch: BatchStatus | None = None
    actions: list[JobAction] = field(default_factory=list)


def _job_reads(settings: WebSettings, job_id: int) -> tuple[Job | None, _JobReads]:
    """The job and what its page shows with it (``None``: no such job)."""
    queue = settings.queue
    job = queue.get_job(job_id)
    if job is None:
        return None, _JobReads()
    workflow = batch = None
    if job.batch_id is not None:  # a workflow is a batch whose children wait for each other
        workflow = queue.workflow_summary(job.batch_id)
        batch = queue.get_batch(job.batch_id) if workflow is None else None
    return job, _JobReads(workflow=workflow, batch=batch, actions=queue.job_actions(job_id))


async def job_page(request: Request) -> Response:
    """One job: payload (secrets redacted), every attempt's error, timestamps, who requeued,
    discarded, cancelled or rescheduled it, its workflow's or batch's counts, and the actions
    on a waiting job (cancel, retry now, reschedule)."""
    settings = _viewer(request)
    job_id: int = request.path_params["job_id"]
    if not 1 <= job_id <= MAX_JOB_ID:
        raise HTTPException(404, f"there is no job {job_id}")
    job, reads = await run_in_threadpool(_job_reads, settings, job_id)
    if job is None:
        raise HTTPException(404, f"there is no job {job_id}")
    retried = request.query_params.get("retried", "")
    return render(
        request,
        "job.html",
        {
            "job": job,
            "batch": reads.batch,
            "workflow": reads.workflow,
            "actions": reads.actions,
            "retried": int(retried) if retried in ("0", "1") else None,
        },
    )
