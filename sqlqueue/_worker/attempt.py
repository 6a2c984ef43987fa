"""Running one attempt of one job through its task's pipeline (sqlqueue/_worker/pipeline.py): its
gates, its context, its handler (sync in a thread, async on the event loop), its timeout and
its own transaction; :mod:`sqlqueue._worker.classify` turns whatever happened into the outcome.

There is one pipeline and two ways into it, chosen per task when the task is made: a direct
plan starts on a handler thread (:func:`start_direct`), any other runs in an asyncio task
(:func:`execute`). Both run the same handler steps (:func:`_in_thread`, :func:`_on_loop`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from functools import partial
from typing import Any

from sqlalchemy import Connection

from sqlqueue._context import JobContext
from sqlqueue._errors import JobTimeout, PayloadError
from sqlqueue._logs import current_job
from sqlqueue._payload import check_result
from sqlqueue._scrub import clip
from sqlqueue._store import batches, outcomes
from sqlqueue._store.rows import ClaimedJob
from sqlqueue._store.store import Store
from sqlqueue._task import Task
from sqlqueue._worker import admission as _admission
from sqlqueue._worker.classify import (
    BadResult,
    NoHandler,
    Outcome,
    PayloadMismatch,
    classify,
    succeeded,
)
from sqlqueue._worker.dbthread import DatabaseThread
from sqlqueue._worker.threads import HandlerThreads, Ticket

__all__ = ["Runtime", "execute", "start_direct"]

log = logging.getLogger("sqlqueue.worker")


@dataclass(frozen=True, kw_only=True)
class Runtime:
    """What running a job needs from its worker."""

    threads: HandlerThreads
    store: Store
    worker_id: str
    known: list[str]
    max_result_bytes: int
    make_context: Callable[[ClaimedJob], JobContext]
    forget_context: Callable[[ClaimedJob], None]
    #: The worker's database thread: where the gates' statements run.
    db: DatabaseThread
    #: The queues whose running jobs are capped (``max_running``), as last read.
    capped_queues: Callable[[], Collection[str]] = frozenset


async def execute(job: ClaimedJob, task: Task | None, runtime: Runtime) -> Outcome:
    """Run one attempt whose task's plan is not direct (or a job no task handles): its
    loop-side steps — gates, context, watch, timeout — around the handler's steps, which run
    in a thread (sync) or on this loop (async); see sqlqueue/_worker/pipeline.py."""
    started = time.monotonic()
    admission: _admission.Admission | None = None
    context: JobContext | None = None
    # The job is current in this attempt's own asyncio task from here on: what the gates and
    # the outcome's classification log carries its fields too (see sqlqueue/_logs.py).
    current_job.set(job)
    try:
        if task is None:
            raise NoHandler(
                f"no handler for job type {job.job_type!r} in this worker "
                f"(it knows: {', '.join(runtime.known) or 'nothing'}); register the task or run a "
                "worker that has it, then requeue this job"
            )
        plan = task.plan
        # An async handler's steps are awaited here, not through _watch: a coroutine fewer
        # per job on the loop.
        watch = _on_loop if task.is_async else _watch
        kwargs = _arguments(task, job)
        if plan.gates:
            admission = await _admission.admit(task, job, runtime)  # or Snooze: deferred
        if plan.context is not None:
            context = runtime.make_context(job)
            kwargs[plan.context] = context
            try:
                result, recorded, landed = await watch(task, job, runtime, kwargs, context)
            finally:
                runtime.forget_context(job)
        else:
            result, recorded, landed = await watch(task, job, runtime, kwargs, None)
    except BaseException as error:
        if isinstance(error, asyncio.CancelledError) and _being_cancelled():
            raise  # the worker stops this job (shutdown): no outcome, the job is released
        outcome = classify(job, task, error, time.monotonic() - started)
        if admission is not None:
            await _admission.report(admission, runtime, error)
        return outcome
    if admission is not None:
        await _admission.report(admission, runtime, None)
    if landed and context is not None and context._released:
        # Again once committed, as Store.finish does: another pool's claim before the commit
        # may have moved a floor back past the steps this job's transaction released.
        runtime.store.claim_floors.lower(context._released)
    return succeeded(
        job,
        time.monotonic() - started,
        result,
        recorded=recorded,
        landed=landed,
        claimable=context._made_claimable if recorded and context is not None else frozenset(),
    )


def start_direct(job: ClaimedJob, task: Task, runtime: Runtime) -> Ticket:
    """Start one attempt of a task whose plan is direct (no loop-side step: a sync handler
    without gates, job context or timeout) on a handler thread, without an asyncio task.

    The handler thread runs the plan's steps and decides the outcome itself, and the ticket's
    future carries it: the event loop then pays no task step per job to await the thread,
    which cost a plain sync job about as much again as the rest of its bookkeeping.
    Cancelling the future abandons the call (:meth:`HandlerThreads.abandon`)."""
    started = time.monotonic()

    def attempt() -> Outcome:
        try:
            result = _in_thread(task, job, runtime, _arguments(task, job), None)[0]
        except BaseException as error:  # as execute() does: every error is an outcome
            return classify(job, task, error, time.monotonic() - started)
        return succeeded(job, time.monotonic() - started, result)

    return runtime.threads.submit(attempt)


def _being_cancelled() -> bool:
    """Whether this job's task is being cancelled, as opposed to a handler that raised
    ``CancelledError`` itself (say, from a future it was waiting on): that is an error like
    any other, or the job would keep its lease for as long as the worker lives."""
    current = asyncio.current_task()
    return current is None or current.cancelling() > 0


def _arguments(task: Task, job: ClaimedJob) -> dict[str, Any]:
    """The ``arguments`` step: the handler's keyword arguments from the job's payload, or
    :class:`PayloadMismatch` when they do not fit."""
    payload = job.payload
    context = task.context_parameter
    if (
        type(payload) is dict
        and task.payload_fits(payload)
        and (context is None or context not in payload)
    ):
        return dict(payload)
    _check_arguments(task, job)
    return dict(job.payload)


def _check_arguments(task: Task, job: ClaimedJob) -> None:
    """Raise :class:`PayloadMismatch`, saying why, unless ``job``'s payload fits the handler."""
    if not isinstance(job.payload, dict):  # written around sqlqueue (raw SQL, another service)
        raise PayloadMismatch(
            f"the payload is not a JSON object but {type(job.payload).__name__} "
            f"{clip(repr(job.payload), 200)}: handlers take keyword arguments"
        )
    context = task.context_parameter
    if task.payload_fits(job.payload) and (context is None or context not in job.payload):
        return
    try:
        if context is not None and context in job.payload:
            raise TypeError(f"{context!r} is the handler's JobContext, not a payload field")
        task.signature.bind(**job.payload, **({context: None} if context else {}))
    except TypeError as error:
        parameters = ", ".join(
            str(p.replace(annotation=p.empty)) for p in task.signature.parameters.values()
        )
        raise PayloadMismatch(
            f"the payload does not fit {task.name}({parameters}): {error}"
        ) from None


def _completion(
    runtime: Runtime, job: ClaimedJob, result: Any, context: JobContext
) -> Callable[[Connection], bool]:
    """The fenced success write, for a handler's own transaction: with the job's batch counting
    its ending, and the children it added (``ctx.add_to_batch``), in the same transaction."""

    def complete(conn: Connection) -> bool:
        dialect = runtime.store.dialect
        endings = batches.Endings()
        landed = outcomes.complete(
            conn,
            dialect,
            worker_id=runtime.worker_id,
            fences=[job.fence],
            results={job.id: result},
            endings=endings,
        )
        if job.id not in landed:
            return False
        if job.batch_id is not None:
            endings.grew(job.batch_id, context.added_to_batch)
        if endings:
            settled = batches.settle(conn, dialect, endings)
            context._made_claimable = settled.queues
            context._released = settled.released
            runtime.store.claim_floors.lower(settled.released)  # see Store._write_outcomes
        return True

    return complete


def _result_of(returned: Any, context: JobContext | None) -> Any:
    """The ``result`` step's value: the handler's return value, or what it gave
    ``ctx.set_result`` when it returned ``None``."""
    return returned if context is None else context.result_of(returned)


def _checked_result(result: Any, runtime: Runtime, returned: Any) -> Any:
    """``result`` as it will be stored, or :class:`BadResult` naming where it came from: the
    handler's return value, or (when it returned ``None``) what it gave ``ctx.set_result``."""
    try:
        return check_result(result, max_bytes=runtime.max_result_bytes)
    except PayloadError as error:
        source = "the handler's return value" if returned is not None else "ctx.set_result's value"
        raise BadResult(f"{source} cannot be stored: {error}") from None


async def _watch(
    task: Task,
    job: ClaimedJob,
    runtime: Runtime,
    kwargs: dict[str, Any],
    context: JobContext | None,
) -> tuple[Any, bool, bool]:
    """The ``watch`` and ``timeout`` steps: await the handler's steps (in a thread, or on this
    loop) within the task's timeout; return ``(result, recorded, landed)``."""
    timeout = task.timeout
    if task.is_async:
        return await _on_loop(task, job, runtime, kwargs, context)
    ticket = runtime.threads.submit(partial(_in_thread, task, job, runtime, kwargs, context))
    try:
        # Awaited directly: a cancelled or timed-out wait cancels the ticket's future, and the
        # thread's late result is dropped (see HandlerThreads); abandon() handles the thread.
        if timeout is None:
            outcome: tuple[Any, bool, bool] = await ticket.future
        else:
            outcome = await asyncio.wait_for(ticket.future, timeout)
        return outcome
    except TimeoutError:
        returned = runtime.threads.abandon(ticket)
        if returned is not None and _limited(task, job, runtime):
            # The thread was told to stop, but a blocking call ends only when it returns:
            # until then the handler runs, so a job under a limit (its task's Concurrency, its
            # queue's max_running) keeps its slots, which its outcome frees, until it has. Its
            # lease is heartbeated meanwhile. An unlimited job's outcome is written at once and
            # its worker slot serves again, beside the abandoned thread.
            log.warning(
                "%s (job %d) ran past its timeout of %g s under a concurrency limit: its "
                "thread is interrupted, and the job keeps its slots until the handler returns",
                task.name,
                job.id,
                task.timeout,
            )
            await returned
        raise _timed_out(task, job) from None
    except asyncio.CancelledError:
        runtime.threads.abandon(ticket)
        raise


def _limited(task: Task, job: ClaimedJob, runtime: Runtime) -> bool:
    """Whether ``job`` counts against a limit of running jobs shared by every worker."""
    return task.concurrency is not None or job.queue in runtime.capped_queues()


def _in_thread(
    task: Task,
    job: ClaimedJob,
    runtime: Runtime,
    kwargs: dict[str, Any],
    context: JobContext | None,
) -> tuple[Any, bool, bool]:
    """The handler's steps for a sync handler, on its thread (every route): the handler call
    with the plan's extra steps around it, the ``result`` check and the ``transaction``. The
    job is the current one meanwhile, for the records logged (see sqlqueue/_logs.py)."""
    scope = current_job.set(job)
    try:
        try:
            returned = task.plan.call(job, kwargs)
            value = _checked_result(_result_of(returned, context), runtime, returned)
        except BaseException:
            if context is not None:
                context.finish_sync(None)
            raise
        if context is not None and context.in_transaction:
            return value, True, context.finish_sync(_completion(runtime, job, value, context))
        return value, False, False
    finally:
        current_job.reset(scope)


async def _on_loop(
    task: Task,
    job: ClaimedJob,
    runtime: Runtime,
    kwargs: dict[str, Any],
    context: JobContext | None,
) -> tuple[Any, bool, bool]:
    """The handler's steps for an async handler, on the loop: as :func:`_in_thread`, with the
    task's timeout around the call. The job is current in its asyncio task, which is this
    attempt's own."""
    timeout = task.timeout
    current_job.set(job)
    try:
        call = task.plan.call(job, kwargs)
        returned = await (call if timeout is None else asyncio.wait_for(call, timeout))
        result = _checked_result(_result_of(returned, context), runtime, returned)
    except TimeoutError:
        await _abort(context)
        raise _timed_out(task, job) from None
    except BaseException:
        await _abort(context)
        raise
    if context is not None and context.in_transaction:
        landed = await context.finish_async(_completion(runtime, job, result, context))
        if context.in_transaction:  # a sync transaction() opened from an async handler
            landed = context.finish_sync(_completion(runtime, job, result, context))
        return result, True, landed
    return result, False, False


async def _abort(context: JobContext | None) -> None:
    """Roll back whatever transaction the handler opened."""
    if context is not None:
        await context.finish_async(None)
        context.finish_sync(None)


def _timed_out(task: Task, job: ClaimedJob) -> JobTimeout:
    return JobTimeout(
        f"{task.name} ran past its timeout of {task.timeout:g} s (attempt {job.attempt})"
    )
