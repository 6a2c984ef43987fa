"""The app factory: the routes, the static files shipped in the package, the error pages, the
guard every request passes (allowed hosts, security headers), and the host's settings on the
app's state. Mount the app anywhere: every link is built from the request's mount prefix."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from sqlqueue._errors import ConfigurationError, DatabaseError, JobNotFound, JobStateError
from sqlqueue._queue import Queue
from sqlqueue.web import (
    _actions,
    _bulk,
    _groups,
    _job_actions,
    _pages,
    _schedules,
    _workers,
    _workflows,
)
from sqlqueue.web._csrf import secret_key_of
from sqlqueue.web._guard import Guard
from sqlqueue.web._hosts import AllowedHosts
from sqlqueue.web._render import render
from sqlqueue.web._settings import Authorize, CurrentUser, WebSettings, everyone, web_user

__all__ = ["create_app"]


def _routes() -> list[BaseRoute]:
    """Every page and action, each named for :func:`sqlqueue.web._render.link`."""
    post = ["POST"]
    return [
        Route("/", _pages.overview, name="overview"),
        Route("/chart", _pages.chart, name="chart"),
        Route("/jobs", _pages.job_list, name="jobs"),
        Route("/jobs/requeue", _actions.requeue_matching, methods=post, name="requeue_matching"),
        Route("/jobs/discard", _actions.discard_matching, methods=post, name="discard_matching"),
        Route("/jobs/bulk", _bulk.confirm_bulk, methods=post, name="bulk"),
        Route("/jobs/bulk/confirm", _bulk.run_bulk, methods=post, name="bulk_confirm"),
        Route("/jobs/{job_id:int}", _pages.job_page, name="job"),
        Route("/jobs/{job_id:int}/requeue", _actions.requeue_job, methods=post, name="requeue"),
        Route("/jobs/{job_id:int}/discard", _actions.discard_job, methods=post, name="discard"),
        Route("/jobs/{job_id:int}/cancel", _job_actions.cancel_job, methods=post, name="cancel"),
        Route("/jobs/{job_id:int}/retry", _job_actions.retry_job, methods=post, name="retry"),
        Route(
            "/jobs/{job_id:int}/reschedule",
            _job_actions.reschedule_job,
            methods=post,
            name="reschedule",
        ),
        Route("/workers", _workers.workers_page, name="workers"),
        Route("/periodic", _schedules.periodic_page, name="periodic"),
        Route("/batches", _groups.batch_list, name="batches"),
        Route("/batches/{batch_id:int}", _groups.batch_page, name="batch"),
        Route("/workflows", _workflows.workflow_list, name="workflows"),
        Route("/workflows/{workflow_id:int}", _workflows.workflow_page, name="workflow"),
        Route(
            "/workflows/{workflow_id:int}/requeue",
            _workflows.requeue_step,
            methods=post,
            name="requeue_step",
        ),
        Route("/queues/pause", _actions.pause_queue, methods=post, name="pause"),
        Route("/queues/resume", _actions.resume_queue, methods=post, name="resume"),
        Route("/queues/limit", _actions.limit_queue, methods=post, name="limit"),
        Mount("/static", StaticFiles(packages=[("sqlqueue.web", "static")]), name="static"),
    ]


#: What Starlette calls with a request and the exception it raised.
ErrorHandler = Callable[[Request, Exception], Awaitable[Response]]


def _failure(status_code: int) -> ErrorHandler:
    """An error page of ``status_code`` whose message is the exception's (sqlqueue's errors
    say what is wrong and what to do)."""

    async def page(request: Request, error: Exception) -> Response:
        context = {"message": str(error), "status_code": status_code}
        return render(request, "error.html", context, status_code=status_code)

    return page


async def _http_failure(request: Request, error: Exception) -> Response:
    """The page of a refusal the app raised itself (400, 403, 404 …), with its headers."""
    assert isinstance(error, HTTPException)
    response = render(
        request,
        "error.html",
        {"message": error.detail, "status_code": error.status_code},
        status_code=error.status_code,
    )
    if error.headers:
        response.headers.update(error.headers)
    return response


def create_app(
    queue: Queue,
    *,
    authorize: Authorize | None = None,
    current_user: CurrentUser | None = None,
    read_only: bool = False,
    max_queued_age: float = 300.0,
    refresh_seconds: float = 5.0,
    allowed_hosts: Iterable[str] | None = None,
    secret_key: str | bytes | None = None,
) -> Starlette:
    """The web page of ``queue`` as an ASGI app.

    ``authorize(request, action)`` answers whether a request may ``"view"`` the pages or
    ``"requeue"``, ``"discard"``, ``"pause"`` (pause and resume queues, set their limits),
    ``"cancel"``, ``"retry"`` (make a waiting job due now) or ``"reschedule"`` — one job or a
    filtered selection; refused: 403, and the page hides what it may not do (default: everyone
    may do everything — put the app behind your own login). ``current_user(request)`` names who
    acts, recorded on each job an action changes (default ``"web"``). ``read_only=True`` hides
    and refuses every action. ``max_queued_age``: a queue whose oldest due job waited longer
    (seconds) is flagged. ``refresh_seconds``: how often the overview and the lists reload their
    figures in place (a button on the page pauses it).

    ``allowed_hosts``: the hosts the page is served as, each a name or address with an optional
    port (``"ops.example.com"``, ``"localhost:8080"``, ``"[::1]:8080"``; ``"*"``: any, only
    behind a proxy that checks ``Host``); a request naming another host is a 400 (DNS
    rebinding). Default: ``localhost``, ``127.0.0.1`` and ``::1`` on any port.
    ``secret_key`` (at least 32 bytes) signs the forms' CSRF tokens; default
    ``$SQLQUEUE_WEB_SECRET``, else a random key per process — set one when several processes
    serve the page, so that a form one rendered passes in another.
    """
    if not isinstance(queue, Queue):
        raise ConfigurationError(f"queue: expected a sqlqueue.Queue, got {queue!r}")
    for name, hook in (("authorize", authorize), ("current_user", current_user)):
        if hook is not None and not callable(hook):
            raise ConfigurationError(f"{name}: expected a function of the request, got {hook!r}")
        if inspect.iscoroutinefunction(hook):
            raise ConfigurationError(
                f"{name}: expected a plain function (def, not async def): the page calls it "
                "for every request and form and needs its answer at once"
            )
    if max_queued_age < 0:
        raise ConfigurationError(f"max_queued_age must be >= 0 seconds, got {max_queued_age!r}")
    if refresh_seconds <= 0:
        raise ConfigurationError(f"refresh_seconds must be > 0, got {refresh_seconds!r}")
    hosts = AllowedHosts.of(allowed_hosts)
    settings = WebSettings(
        queue=queue,
        read_only=read_only,
        max_queued_age=max_queued_age,
        refresh_seconds=refresh_seconds,
        authorize=everyone if authorize is None else authorize,
        current_user=web_user if current_user is None else current_user,
        secret_key=secret_key_of(secret_key),
    )
    app = Starlette(
        routes=_routes(),
        middleware=[Middleware(Guard, allowed=hosts)],
        exception_handlers={
            HTTPException: _http_failure,
            JobNotFound: _failure(404),
            JobStateError: _failure(409),
            ConfigurationError: _failure(400),
            DatabaseError: _failure(503),
        },
    )
    app.state.sqlqueue = settings
    return app
