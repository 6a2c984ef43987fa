"""The Workers page: every worker process the database knows, from
:meth:`sqlqueue.Queue.workers` — live ones first, then (``?all=1``) those gone without a clean
exit in the last day — with its host, pid, version, queues and their concurrency, when it
started and was last seen, the jobs it runs and whether it is stopping."""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from sqlqueue.web._render import render
from sqlqueue.web._settings import settings_of

__all__ = ["workers_page"]


async def workers_page(request: Request) -> Response:
    """The workers, live first; ``all=1`` adds the gone ones."""
    settings = settings_of(request)
    settings.require(request, "view")
    shown = request.query_params.get("all")
    if shown not in (None, "1"):
        raise HTTPException(400, f"all must be 1 (show gone workers too) or absent, got {shown!r}")
    include_gone = shown == "1"
    workers = await run_in_threadpool(lambda: settings.queue.workers(include_gone=include_gone))
    return render(
        request,
        "workers.html",
        {"workers": workers, "include_gone": include_gone},
    )
