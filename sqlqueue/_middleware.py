"""Middleware: code of the app's around every attempt of every task of a queue
(``@queue.middleware``), and hooks that see each job before it is written
(``@queue.on_enqueue``).

A middleware is ``def mw(job, call_next)`` or ``async def mw(job, call_next)``; the first
registered is the outermost. ``call_next()`` runs the rest of the chain and the handler and
returns the handler's result or raises what it raised; what the middleware returns is the
attempt's result, and what it raises is classified like a handler's error.

Where each kind runs, so that no combination can deadlock:

* around a sync handler, everything runs on the handler's thread: a sync middleware calls
  ``call_next()``; an async one runs in an event loop of its own on that thread
  (``asyncio.run``), and ``await call_next()`` runs the sync rest right there;
* around an async handler, everything runs on the worker's event loop: an async middleware
  awaits ``call_next()``. A sync middleware cannot wrap it — its ``call_next()`` would have to
  wait for the loop it is blocking — so registering one on a queue with an async task (or an
  async task on a queue with one) raises :class:`~sqlqueue.ConfigurationError` at once —
  unless it is marked :func:`for_sync_handlers` (an integration's, such as Django's
  connection upkeep on the handler's thread): async handlers then go without it.

The chain is composed once per task when the task's plan is made (sqlqueue/_worker/pipeline.py),
and sqlqueue's own attempt span is built the same way (:func:`compose` with the claimed row as
what the middleware sees).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from sqlqueue._errors import ConfigurationError
from sqlqueue._job import Job, JobStatus
from sqlqueue._store.rows import error_record

if TYPE_CHECKING:
    from sqlqueue._store.rows import ClaimedJob
    from sqlqueue._task import JobRequest

__all__ = [
    "EnqueueHook",
    "Hooks",
    "Middleware",
    "Middlewares",
    "check_kind",
    "compose",
    "for_sync_handlers",
    "public_job",
]

#: ``mw(job, call_next)``: returns the result (sync) or an awaitable of it (async).
Middleware = Callable[[Any, Callable[[], Any]], Any]
#: ``hook(request) -> request``, before a job is written.
EnqueueHook = Callable[["JobRequest"], "JobRequest"]
#: One handler call as the pipeline makes it: the claimed job and the handler's arguments.
Call = Callable[["ClaimedJob", dict[str, Any]], Any]


def _check_shape(function: Callable[..., Any], what: str, parameters: Sequence[str]) -> None:
    """A clear error now, at registration, for something that cannot be called as asked."""
    shape = f"({', '.join(parameters)})"
    if not callable(function):
        raise ConfigurationError(f"{what} must be callable as {shape}, got {function!r}")
    try:
        inspect.signature(function).bind(*parameters)
    except TypeError:
        name = getattr(function, "__qualname__", repr(function))
        raise ConfigurationError(f"{what} {name} must take {shape}") from None
    except ValueError:  # no signature to read (a builtin): trust it
        return


class Middlewares:
    """A queue's middleware, outermost first, shared by its tasks (and a rebound copy's); and
    the built-in ``metrics`` middleware's meters, one per worker of the queue that serves
    metrics (see sqlqueue/_worker/call_metrics.py)."""

    def __init__(self) -> None:
        self.chain: tuple[Middleware, ...] = ()
        #: Each metrics-serving worker's meter of handler calls, by worker id.
        self.meters: dict[str | None, Any] = {}

    def meter(self, worker_id: str, meter: Any | None) -> None:
        """Start (``meter``) or stop (``None``) metering ``worker_id``'s handler calls; the
        queue plans its tasks again after this (the step comes and goes with the meters)."""
        if meter is None:
            self.meters.pop(worker_id, None)
        else:
            self.meters[worker_id] = meter

    def add(self, middleware: Middleware) -> None:
        """Append ``middleware`` (the innermost so far), after checking its shape."""
        _check_shape(middleware, "a middleware", ("job", "call_next"))
        self.chain = (*self.chain, middleware)


class Hooks:
    """A queue's ``on_enqueue`` hooks, in registration order."""

    def __init__(self) -> None:
        self.chain: tuple[EnqueueHook, ...] = ()

    def add(self, hook: EnqueueHook) -> None:
        """Append ``hook``, after checking its shape."""
        _check_shape(hook, "an on_enqueue hook", ("request",))
        self.chain = (*self.chain, hook)


#: The attribute :func:`for_sync_handlers` sets on a middleware.
_SYNC_HANDLERS_ONLY = "_sqlqueue_sync_handlers_only"


def for_sync_handlers(middleware: Middleware) -> Middleware:
    """Mark the sync ``middleware`` as wrapping sync handlers only, on their thread: async
    handlers (on the worker's loop) go without it instead of being refused. Returns it."""
    setattr(middleware, _SYNC_HANDLERS_ONLY, True)
    return middleware


def _sync_handlers_only(middleware: Middleware) -> bool:
    return bool(getattr(middleware, _SYNC_HANDLERS_ONLY, False))


def check_kind(chain: Sequence[Middleware], task_name: str, is_async: bool) -> None:
    """Refuse a sync middleware around an async handler (see the module docstring)."""
    if not is_async:
        return
    for middleware in chain:
        if not inspect.iscoroutinefunction(middleware) and not _sync_handlers_only(middleware):
            name = getattr(middleware, "__qualname__", repr(middleware))
            raise ConfigurationError(
                f"the sync middleware {name} cannot wrap the async task {task_name!r}: its "
                "call_next() would block the event loop the handler runs on; make it an "
                "`async def` middleware (which wraps sync handlers too)"
            )


#: The fields of a claimed job's :class:`Job` that the claim does not read.
_UNREAD: dict[str, Any] = {
    "status": JobStatus.RUNNING,
    "finished_at": None,
    "result": None,
    "progress": None,
    "idempotency_key": None,
    "group_key": None,
    "cancel_requested_at": None,
    "locked_by": None,
    "requeued_from": None,
    "requeued_as": None,
    "requeued_at": None,
    "requeued_by": None,
    "requeue_reason": None,
    "discarded_at": None,
    "discarded_by": None,
    "discard_reason": None,
    "tags": (),  # read by get_job only, as in listings
    "expires_at": None,
    "unique_key": None,
}


def public_job(job: ClaimedJob) -> Job:
    """The claimed job as a middleware sees it: a :class:`~sqlqueue.Job` in ``running``, as the
    claim read it (what the claim does not read — idempotency and group keys, requeue and
    discard records — is ``None``).

    Made once per attempt, so it fills the frozen instance's ``__dict__`` at once instead of
    through the dataclass ``__init__`` (one guarded ``__setattr__`` per field: most of what an
    empty middleware would cost)."""
    errors = job.errors
    public = object.__new__(Job)
    fields = public.__dict__
    fields.update(_UNREAD)
    fields.update(
        id=job.id,
        job_type=job.job_type,
        queue=job.queue,
        priority=job.priority,
        payload=job.payload,
        attempts=job.attempt,
        max_attempts=job.max_attempts,
        next_run_at=job.next_run_at,
        created_at=job.created_at,
        updated_at=job.started_at,
        started_at=job.started_at,
        last_error=str(errors[-1]["error"]) if errors else None,
        errors=tuple(error_record(entry) for entry in errors) if errors else (),
        lease_expires_at=job.lease_expires_at,
        batch_id=job.batch_id,
    )
    return public


def compose(
    chain: Sequence[Middleware],
    call: Call,
    *,
    is_async: bool,
    view: Callable[[ClaimedJob], Any] = public_job,
) -> Call:
    """``call`` with ``chain`` around it, outermost first; each middleware gets ``view(job)``
    (made once per attempt). ``is_async``: ``call`` returns an awaitable and so does the
    composed call."""
    middlewares = tuple(chain)
    if is_async:
        middlewares = tuple(each for each in middlewares if not _sync_handlers_only(each))
    if not middlewares:
        return call
    if is_async:
        return _compose_async(middlewares, call, view)
    return _compose_sync(middlewares, call, view)


def _compose_async(
    middlewares: tuple[Middleware, ...], call: Call, view: Callable[[ClaimedJob], Any]
) -> Call:
    last = len(middlewares)

    async def run(job: ClaimedJob, kwargs: dict[str, Any]) -> Any:
        seen = view(job)

        def at(index: int) -> Any:
            if index == last:
                return call(job, kwargs)
            return middlewares[index](seen, lambda: at(index + 1))

        return await at(0)

    return run


def _compose_sync(
    middlewares: tuple[Middleware, ...], call: Call, view: Callable[[ClaimedJob], Any]
) -> Call:
    last = len(middlewares)
    kinds = tuple(inspect.iscoroutinefunction(middleware) for middleware in middlewares)
    if last == 1 and not kinds[0]:  # the common case, without the recursion
        (only,) = middlewares

        def run_one(job: ClaimedJob, kwargs: dict[str, Any]) -> Any:
            return only(view(job), lambda: call(job, kwargs))

        return run_one

    def run(job: ClaimedJob, kwargs: dict[str, Any]) -> Any:
        seen = view(job)

        def at(index: int) -> Any:
            if index == last:
                return call(job, kwargs)
            middleware = middlewares[index]
            if not kinds[index]:
                return middleware(seen, lambda: at(index + 1))

            async def call_next() -> Any:
                return at(index + 1)

            # An event loop of its own on the handler's thread: never the worker's loop, which
            # this thread must not wait on.
            return asyncio.run(middleware(seen, call_next))

        return at(0)

    return run
