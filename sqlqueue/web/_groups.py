"""Pages of groups of jobs: the list of batches, newest first, and a page per batch (its counts
by status and its children). A kind of group is two reads — a page of groups, one group — and
two routes; workflows add theirs the same way (:mod:`sqlqueue.web._workflows`) and share the
templates' counts bar."""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from sqlqueue._batch import BatchStatus
from sqlqueue._job import Job, JobStatus
from sqlqueue.web._query import MAX_JOB_ID, job_list_filter
from sqlqueue.web._render import render
from sqlqueue.web._settings import WebSettings, settings_of

__all__ = ["GROUPS_PER_PAGE", "batch_list", "batch_page"]

#: Groups per page of a list, and children per page of a group.
GROUPS_PER_PAGE = 50


def _viewer(request: Request) -> WebSettings:
    settings = settings_of(request)
    settings.require(request, "view")
    return settings


async def batch_list(request: Request) -> Response:
    """The batches, newest first, a page at a time, each with its counts by status."""
    settings = _viewer(request)
    before_id = job_list_filter(request.query_params).before_id
    found = await run_in_threadpool(
        lambda: settings.queue.batches(limit=GROUPS_PER_PAGE + 1, before_id=before_id)
    )
    shown = found[:GROUPS_PER_PAGE]
    return render(
        request,
        "batches.html",
        {
            "batches": shown,
            "statuses": [status.value for status in JobStatus],
            "before_id": before_id,
            "next_before_id": shown[-1].id if len(found) > GROUPS_PER_PAGE else None,
        },
    )


async def batch_page(request: Request) -> Response:
    """One batch: its counts, its callback, and its children, newest first, a page at a time."""
    settings = _viewer(request)
    batch_id: int = request.path_params["batch_id"]
    if not 1 <= batch_id <= MAX_JOB_ID:
        raise HTTPException(404, f"there is no batch {batch_id}")
    before_id = job_list_filter(request.query_params).before_id
    queue = settings.queue

    def read() -> tuple[BatchStatus | None, list[Job]]:
        batch = queue.get_batch(batch_id)
        if batch is None:
            return None, []
        return batch, queue.jobs(batch_id=batch_id, limit=GROUPS_PER_PAGE + 1, before_id=before_id)

    batch, found = await run_in_threadpool(read)
    if batch is None:
        raise HTTPException(404, f"there is no batch {batch_id}")
    jobs = found[:GROUPS_PER_PAGE]
    return render(
        request,
        "batch.html",
        {
            "batch": batch,
            "jobs": jobs,
            "statuses": [status.value for status in JobStatus],
            "before_id": before_id,
            "next_before_id": jobs[-1].id if len(found) > GROUPS_PER_PAGE else None,
        },
    )
