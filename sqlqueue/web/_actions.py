"""The changes an operator makes from the page, each a POST carrying the CSRF token and a
reason: requeue or discard one dead job or every unhandled dead job matching the list's filter,
and pause or resume a queue. Who acted comes from the host's ``current_user``; the checks run
in this order — origin and token (see :mod:`sqlqueue.web._csrf`), permission, reason — and a
refused request changes nothing."""

from __future__ import annotations

import time
from collections.abc import Callable

from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from sqlqueue._digits import ascii_number
from sqlqueue._errors import ConfigurationError
from sqlqueue.web._csrf import origin_problem, token_problem
from sqlqueue.web._query import job_list_filter
from sqlqueue.web._render import link
from sqlqueue.web._settings import Action, WebSettings, settings_of

__all__ = [
    "checked",
    "discard_job",
    "discard_matching",
    "field",
    "limit_queue",
    "pause_queue",
    "requeue_job",
    "requeue_matching",
    "resume_queue",
    "see",
]

_MAX_REASON = 2000


async def checked(
    request: Request, action: Action | Callable[[FormData], Action]
) -> tuple[WebSettings, FormData]:
    """The form of a POST that comes from the page itself, whose token and permission hold;
    403 otherwise (the form is read only once the origin holds). ``action`` may be read from
    the form (a bulk action names its own)."""
    settings = settings_of(request)
    refused = origin_problem(request)
    if refused is not None:
        raise HTTPException(403, refused)
    form = await request.form()
    refused = token_problem(request, form, settings.secret_key, time.time())
    if refused is not None:
        raise HTTPException(403, refused)
    settings.require(request, action(form) if callable(action) else action)
    return settings, form


def field(form: FormData, name: str, what: str) -> str:
    """Form field ``name``, stripped; 400 when it is missing, blank, too long or holds a NUL."""
    value = form.get(name)
    text = value.strip() if isinstance(value, str) else ""
    if not text:
        raise HTTPException(400, f"give {what}")
    if len(text) > _MAX_REASON:
        raise HTTPException(400, f"{name} is longer than {_MAX_REASON} characters")
    if "\x00" in text:
        raise HTTPException(400, f"{name} contains a NUL character")
    return text


def see(
    request: Request, name: str, query: dict[str, object] | None = None, **path: object
) -> Response:
    """Post/redirect/get: reloading the page that follows never repeats the action."""
    return RedirectResponse(link(request, name, query, **path), status_code=303)


async def requeue_job(request: Request) -> Response:
    """Requeue one dead job as a new job; back to the dead job, which now links to it."""
    settings, form = await checked(request, "requeue")
    reason = field(form, "reason", "a reason")
    job_id: int = request.path_params["job_id"]
    await run_in_threadpool(
        lambda: settings.queue.requeue(job_id, by=settings.who(request), reason=reason)
    )
    return see(request, "job", job_id=job_id)


async def discard_job(request: Request) -> Response:
    """Mark one dead job handled without running it."""
    settings, form = await checked(request, "discard")
    reason = field(form, "reason", "a reason")
    job_id: int = request.path_params["job_id"]
    await run_in_threadpool(
        lambda: settings.queue.discard(job_id, by=settings.who(request), reason=reason)
    )
    return see(request, "job", job_id=job_id)


async def _matching(request: Request, action: Action) -> Response:
    """``action`` on every unhandled dead job matching the form's filter (which must narrow
    it); back to the list, with how many were done."""
    settings, form = await checked(request, action)
    reason = field(form, "reason", "a reason")
    wanted = job_list_filter(form)
    if wanted.tag is not None:
        raise HTTPException(
            400, f"refusing to {action} every dead job with a tag filter: tick the jobs instead"
        )
    if not wanted.narrows_dead:
        raise HTTPException(
            400, f"refusing to {action} every dead job: filter by type, queue, error or since"
        )
    queue = settings.queue
    by = settings.who(request)

    def act() -> list[int]:
        where = queue.requeue_where if action == "requeue" else queue.discard_where
        return where(
            by=by,
            reason=reason,
            job_type=wanted.job_type,
            queue=wanted.queue,
            error_contains=wanted.error,
            since=wanted.since_moment(queue),
        )

    done = await run_in_threadpool(act)
    past = "requeued" if action == "requeue" else "discarded"
    return see(request, "jobs", {**wanted.query(), "status": "dead", past: len(done)})


async def requeue_matching(request: Request) -> Response:
    """Requeue every unhandled dead job matching the list's filter."""
    return await _matching(request, "requeue")


async def discard_matching(request: Request) -> Response:
    """Discard every unhandled dead job matching the list's filter."""
    return await _matching(request, "discard")


async def pause_queue(request: Request) -> Response:
    """Stop workers claiming from a queue; back to the overview."""
    settings, form = await checked(request, "pause")
    name = field(form, "queue", "a queue")
    reason = field(form, "reason", "a reason")
    await run_in_threadpool(
        lambda: settings.queue.pause(name, by=settings.who(request), reason=reason)
    )
    return see(request, "overview")


async def limit_queue(request: Request) -> Response:
    """Cap a queue's running jobs across all workers (a blank limit lifts the cap)."""
    settings, form = await checked(request, "pause")
    name = field(form, "queue", "a queue")
    value = form.get("limit")
    text = value.strip() if isinstance(value, str) else ""
    limit = ascii_number(text, max_digits=10) if text else None
    if text and limit is None:
        raise HTTPException(400, "the limit must be a whole number >= 1, or blank for none")
    try:
        await run_in_threadpool(settings.queue.set_queue_limit, name, limit)
    except ConfigurationError as error:
        raise HTTPException(400, str(error)) from None
    return see(request, "overview")


async def resume_queue(request: Request) -> Response:
    """Let workers claim from a paused queue again."""
    settings, form = await checked(request, "pause")
    name = field(form, "queue", "a queue")
    await run_in_threadpool(settings.queue.resume, name)
    return see(request, "overview")
