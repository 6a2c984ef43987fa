"""The actions on one waiting job from its page, each a POST with the CSRF token and a reason,
recorded with who and why (:meth:`sqlqueue.Queue.job_actions`): cancel (a running job is asked
to stop), retry now (due at once), and reschedule (a new run time, ISO 8601 or ``+30m``)."""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from sqlqueue._errors import ConfigurationError
from sqlqueue._operators.moments import parse_run_time
from sqlqueue.web._actions import checked, field, see

__all__ = ["cancel_job", "reschedule_job", "retry_job"]


async def cancel_job(request: Request) -> Response:
    """Cancel a queued or failed job, or ask a running one to stop; back to the job."""
    settings, form = await checked(request, "cancel")
    reason = field(form, "reason", "a reason")
    job_id: int = request.path_params["job_id"]
    await run_in_threadpool(
        lambda: settings.queue.cancel(job_id, by=settings.who(request), reason=reason)
    )
    return see(request, "job", job_id=job_id)


async def retry_job(request: Request) -> Response:
    """Make a queued or failed job that waits for a later time due now; back to the job, which
    says when nothing was waiting (it was due already)."""
    settings, form = await checked(request, "retry")
    reason = field(form, "reason", "a reason")
    job_id: int = request.path_params["job_id"]
    count = await run_in_threadpool(
        lambda: settings.queue.run_now([job_id], by=settings.who(request), reason=reason)
    )
    return see(request, "job", {"retried": count}, job_id=job_id)


async def reschedule_job(request: Request) -> Response:
    """Give a queued or failed job a new run time (not in the past, by the database clock);
    a time that is not one is a 400 that says what is wrong."""
    settings, form = await checked(request, "reschedule")
    when = field(form, "run_at", "a new run time")
    reason = field(form, "reason", "a reason")
    job_id: int = request.path_params["job_id"]
    queue = settings.queue

    def act() -> None:
        try:
            run_at = parse_run_time(when, now=queue.database_now())
        except ConfigurationError as error:
            raise HTTPException(400, str(error)) from None
        queue.reschedule(job_id, run_at, by=settings.who(request), reason=reason)

    await run_in_threadpool(act)
    return see(request, "job", job_id=job_id)
