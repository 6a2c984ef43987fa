"""Bulk actions on the job list: requeue, discard or cancel the jobs ticked on the page, or every
job matching the list's filter (on every page). Two POSTs, each behind the CSRF token and the
host's ``authorize``: the first asks how many jobs the action would change and shows a
confirmation that states the count and asks why; the second acts and records who and why on
each job. Requeue and discard take only dead jobs nobody has handled; cancel takes queued and
failed jobs. "Every matching job" needs a filter that narrows the list (type, queue, error or
since): an empty filter would mean every job in the database."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Literal

from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from sqlqueue._digits import ascii_number
from sqlqueue._queue import Queue
from sqlqueue.web._actions import checked, field, see
from sqlqueue.web._query import MAX_JOB_ID, JobListFilter, job_list_filter
from sqlqueue.web._render import render

__all__ = ["MAX_SELECTED", "BulkAction", "action_of", "bulk_of", "confirm_bulk", "run_bulk"]

BulkName = Literal["requeue", "discard", "cancel"]
#: The statuses each bulk action takes: those its operation takes (a cancel takes a workflow's
#: ``waiting`` steps too), so that the confirmation counts what the action will change.
APPLIES: dict[BulkName, tuple[str, ...]] = {
    "requeue": ("dead",),
    "discard": ("dead",),
    "cancel": ("queued", "failed", "waiting"),
}
#: What the list's notice says was done, per action.
PAST: dict[BulkName, str] = {"requeue": "requeued", "discard": "discarded", "cancel": "cancelled"}
#: The most jobs one can tick (a page shows fewer; more is a forged form).
MAX_SELECTED = 1000


@dataclass(frozen=True, kw_only=True)
class BulkAction:
    """One bulk action as the form asks it: which action, on which jobs (``job_ids``: those
    ticked; ``None``: every job matching ``wanted``), from ``since`` (resolved once, so that
    the confirmation and the action mean the same instant)."""

    action: BulkName
    wanted: JobListFilter
    job_ids: tuple[int, ...] | None
    since: datetime | None

    @property
    def statuses(self) -> tuple[str, ...]:
        """The statuses the action takes within the list's filter (none: nothing to do)."""
        applies = APPLIES[self.action]
        if self.wanted.unhandled and self.action == "cancel":
            return ()  # the list shows dead jobs only
        if self.wanted.status is None:
            return applies
        return (self.wanted.status,) if self.wanted.status in applies else ()

    def fields(self) -> dict[str, str]:
        """The hidden fields of the confirmation's form: the same action on the same jobs."""
        query = self.wanted.query()
        if self.since is not None:
            query["since"] = self.since.isoformat()
        values = {key: value for key, value in query.items() if value}
        values["action"] = self.action
        values["scope"] = "matching" if self.job_ids is None else "selected"
        return values

    def count(self, queue: Queue) -> int:
        """How many jobs the action would change now."""
        return sum(
            queue.count_jobs(
                status=status,
                unhandled=status == "dead",
                job_type=self.wanted.job_type,
                queue=self.wanted.queue,
                error_contains=self.wanted.error,
                since=self.since,
                job_ids=self.job_ids,
            )
            for status in self.statuses
        )

    def run(self, queue: Queue, *, by: str, reason: str) -> int:
        """Do it, recording ``by`` and ``reason`` on each job; how many jobs changed."""
        statuses = self.statuses
        if not statuses:
            return 0
        wanted = self.wanted
        if self.action == "cancel":
            return queue.cancel_where(
                status=statuses[0] if len(statuses) == 1 else None,
                job_type=wanted.job_type,
                queue=wanted.queue,
                error_contains=wanted.error,
                since=self.since,
                job_ids=self.job_ids,
                by=by,
                reason=reason,
            )
        where = queue.requeue_where if self.action == "requeue" else queue.discard_where
        done = where(
            job_type=wanted.job_type,
            queue=wanted.queue,
            error_contains=wanted.error,
            since=self.since,
            job_ids=self.job_ids,
            by=by,
            reason=reason,
        )
        return len(done)


def _ids(form: FormData) -> tuple[int, ...]:
    values = form.getlist("job_id")
    if len(values) > MAX_SELECTED:
        raise HTTPException(400, f"tick at most {MAX_SELECTED} jobs, or act on every match")
    ids: list[int] = []
    for value in values:
        text = value.strip() if isinstance(value, str) else ""
        job_id = ascii_number(text)
        if job_id is None or not 1 <= job_id <= MAX_JOB_ID:
            raise HTTPException(400, f"job_id must be a job id, got {str(value)[:40]!r}")
        ids.append(job_id)
    return tuple(dict.fromkeys(ids))


def action_of(form: FormData) -> BulkName:
    """The form's action; 400 unless it is one a bulk action can be."""
    action = form.get("action")
    for name in APPLIES:
        if action == name:
            return name
    raise HTTPException(400, "action must be requeue, discard or cancel")


def bulk_of(form: FormData, queue: Queue) -> BulkAction:
    """The bulk action the form asks for; 400 for an unknown action or scope, no job ticked,
    or every job of an unnarrowed list."""
    action = action_of(form)
    scope = form.get("scope")
    wanted = replace(job_list_filter(form), before_id=None)
    since = wanted.since_moment(queue)
    if scope == "selected":
        ids = _ids(form)
        if not ids:
            raise HTTPException(400, "no job is ticked: tick some, or choose every matching job")
        return BulkAction(action=action, wanted=wanted, job_ids=ids, since=since)
    if scope != "matching":
        raise HTTPException(400, "scope must be selected (the ticked jobs) or matching")
    if wanted.tag is not None:
        raise HTTPException(
            400, f"refusing to {action} every job with a tag filter: tick the jobs instead"
        )
    if not wanted.narrows_dead:
        raise HTTPException(
            400, f"refusing to {action} every job: filter by type, queue, error or since first"
        )
    return BulkAction(action=action, wanted=wanted, job_ids=None, since=since)


async def confirm_bulk(request: Request) -> Response:
    """The confirmation: how many jobs the action would change, and a form asking why."""
    settings, form = await checked(request, action_of)
    queue = settings.queue

    def read() -> tuple[BulkAction, int]:
        bulk = bulk_of(form, queue)
        return bulk, bulk.count(queue)

    bulk, count = await run_in_threadpool(read)
    return render(
        request,
        "confirm.html",
        {"bulk": bulk, "count": count, "wanted": bulk.wanted, "past": PAST[bulk.action]},
    )


async def run_bulk(request: Request) -> Response:
    """The confirmed action; back to the list with how many jobs it changed."""
    settings, form = await checked(request, action_of)
    reason = field(form, "reason", "a reason")
    queue = settings.queue
    by = settings.who(request)

    def act() -> tuple[BulkAction, int]:
        bulk = bulk_of(form, queue)
        return bulk, bulk.run(queue, by=by, reason=reason)

    bulk, done = await run_in_threadpool(act)
    return see(request, "jobs", {**bulk.wanted.query(), PAST[bulk.action]: done})
