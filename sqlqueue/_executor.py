"""Running one attempt of one job, and turning whatever happened into an outcome.

The outcome set is closed: the handler succeeded, or the attempt failed and the job either
retries at a given delay or goes to dead. :func:`classify` is the one function that decides.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import Connection

from sqlqueue import _gates
from sqlqueue._backoff import as_backoff
from sqlqueue._context import JobContext
from sqlqueue._dbthread import DatabaseThread
from sqlqueue._errors import JobTimeout, PayloadError, PermanentError, Retry, Snooze
from sqlqueue._payload import check_result
from sqlqueue._store import transitions
from sqlqueue._store._tx import Store
from sqlqueue._store.rows import ClaimedJob, Failure, error_entry
from sqlqueue._task import Task
from sqlqueue._threads import HandlerThreads, Ticket

__all__ = ["Outcome", "Runtime", "classify", "execute", "start_plain"]

log = logging.getLogger("sqlqueue.worker")

_MAX_TRACEBACK_CHARS = 8_000
_MAX_ERROR_CHARS = 2_000


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """What one attempt produced: ``failure`` is ``None`` when the handler succeeded.

    ``recorded`` means the success was already written in the handler's own transaction
    (``landed`` says whether the lease still held); otherwise the completer writes it.
    """

    job: ClaimedJob
    failure: Failure | None
    elapsed: float
    result: Any = None
    recorded: bool = False
    landed: bool = False

    @property
    def succeeded(self) -> bool:
        """Whether the attempt succeeded."""
        return self.failure is None


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


class _NoHandler(PermanentError):
    """The worker has no task for the job's type."""


class _PayloadMismatch(PermanentError):
    """The payload does not fit the handler's signature."""


class _BadResult(PermanentError):
    """The handler returned something that cannot be stored as the job's result."""


async def execute(job: ClaimedJob, task: Task | None, runtime: Runtime) -> Outcome:
    """Run ``job`` with its task's handler (sync in a thread, async on this loop), once the
    task's gates (circuit breaker, rate limit) let it through."""
    started = time.monotonic()
    admission: _gates.Admission | None = None
    try:
        if task is None:
            raise _NoHandler(
                f"no handler for job type {job.job_type!r} in this worker "
                f"(it knows: {', '.join(runtime.known) or 'nothing'}); register the task or run a "
                "worker that has it, then requeue this job"
            )
        _check_arguments(task, job)
        if task.rate_limit is not None or task.circuit_breaker is not None:
            admission = await _gates.admit(task, job, runtime)  # or Snooze: deferred
        context = runtime.make_context(job) if task.context_parameter else None
        try:
            result, recorded, landed = await _call(task, job, runtime, context)
        finally:
            if context is not None:
                runtime.forget_context(job)
    except BaseException as error:
        if isinstance(error, asyncio.CancelledError) and _being_cancelled():
            raise  # the worker stops this job (shutdown): no outcome, the job is released
        outcome = classify(job, task, error, time.monotonic() - started)
        if admission is not None:
            await _gates.report(admission, runtime, error)
        return outcome
    if admission is not None:
        await _gates.report(admission, runtime, None)
    return Outcome(
        job=job,
        failure=None,
        elapsed=time.monotonic() - started,
        result=result,
        recorded=recorded,
        landed=landed,
    )


def start_plain(job: ClaimedJob, task: Task | None, runtime: Runtime) -> Ticket | None:
    """Start a sync handler that has nothing around it (no gate, no job context, no timeout)
    without an asyncio task of its own; ``None`` for any other job (run it with
    :func:`execute`).

    The handler thread decides the outcome itself and the ticket's future carries it: the
    event loop then pays no task step per job to await the thread, which cost a plain sync
    job about as much again as the rest of its bookkeeping. Cancelling the future abandons
    the call (:meth:`HandlerThreads.abandon`)."""
    if (
        task is None
        or task.is_async
        or task.timeout is not None
        or task.context_parameter is not None
        or task.rate_limit is not None
        or task.circuit_breaker is not None
        or type(job.payload) is not dict  # a row written by hand: execute() reports it
        or not task.payload_fits(job.payload)  # execute() explains the mismatch
    ):
        return None
    started = time.monotonic()
    kwargs = dict(job.payload)

    def attempt() -> Outcome:
        try:
            result = _checked_result(task.handler(**kwargs), runtime)
        except BaseException as error:  # as execute() does: every error is an outcome
            return classify(job, task, error, time.monotonic() - started)
        return Outcome(job=job, failure=None, elapsed=time.monotonic() - started, result=result)

    return runtime.threads.submit(attempt)


def _being_cancelled() -> bool:
    """Whether this job's task is being cancelled, as opposed to a handler that raised
    ``CancelledError`` itself (say, from a future it was waiting on): that is an error like
    any other, or the job would keep its lease for as long as the worker lives."""
    current = asyncio.current_task()
    return current is None or current.cancelling() > 0


def _check_arguments(task: Task, job: ClaimedJob) -> None:
    if not isinstance(job.payload, dict):  # written around sqlqueue (raw SQL, another service)
        raise _PayloadMismatch(
            f"the payload is not a JSON object but {type(job.payload).__name__} "
            f"{storable(repr(job.payload))[:200]}: handlers take keyword arguments"
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
        raise _PayloadMismatch(
            f"the payload does not fit {task.name}({parameters}): {error}"
        ) from None


def _completion(runtime: Runtime, job: ClaimedJob, result: Any) -> Callable[[Connection], bool]:
    """The fenced success write, for a handler's own transaction."""

    def complete(conn: Connection) -> bool:
        landed = transitions.complete(
            conn,
            runtime.store.dialect,
            worker_id=runtime.worker_id,
            fences=[job.fence],
            results={job.id: result},
        )
        return job.id in landed

    return complete


def _checked_result(result: Any, runtime: Runtime) -> Any:
    try:
        return check_result(result, max_bytes=runtime.max_result_bytes)
    except PayloadError as error:
        raise _BadResult(f"the handler's return value cannot be stored: {error}") from None


async def _call(
    task: Task, job: ClaimedJob, runtime: Runtime, context: JobContext | None
) -> tuple[Any, bool, bool]:
    """Run the handler; return ``(result, recorded, landed)``."""
    kwargs: dict[str, Any] = dict(job.payload)
    if context is not None and task.context_parameter is not None:
        kwargs[task.context_parameter] = context
    timeout = task.timeout
    if task.is_async:
        try:
            result = _checked_result(
                await (
                    task.handler(**kwargs)
                    if timeout is None
                    else asyncio.wait_for(task.handler(**kwargs), timeout)
                ),
                runtime,
            )
        except TimeoutError:
            await _abort(context)
            raise _timed_out(task, job) from None
        except BaseException:
            await _abort(context)
            raise
        if context is not None and context.in_transaction:
            landed = await context.finish_async(_completion(runtime, job, result))
            if context.in_transaction:  # a sync transaction() opened from an async handler
                landed = context.finish_sync(_completion(runtime, job, result))
            return result, True, landed
        return result, False, False

    def run_in_thread() -> tuple[Any, bool, bool]:
        try:
            value = _checked_result(task.handler(**kwargs), runtime)
        except BaseException:
            if context is not None:
                context.finish_sync(None)
            raise
        if context is not None and context.in_transaction:
            return value, True, context.finish_sync(_completion(runtime, job, value))
        return value, False, False

    ticket = runtime.threads.submit(run_in_thread)
    try:
        # Awaited directly: a cancelled or timed-out wait cancels the ticket's future, and the
        # thread's late result is dropped (see HandlerThreads); abandon() handles the thread.
        if timeout is None:
            outcome: tuple[Any, bool, bool] = await ticket.future
        else:
            outcome = await asyncio.wait_for(ticket.future, timeout)
        return outcome
    except TimeoutError:
        runtime.threads.abandon(ticket)
        raise _timed_out(task, job) from None
    except asyncio.CancelledError:
        runtime.threads.abandon(ticket)
        raise


async def _abort(context: JobContext | None) -> None:
    """Roll back whatever transaction the handler opened."""
    if context is not None:
        await context.finish_async(None)
        context.finish_sync(None)


def _timed_out(task: Task, job: ClaimedJob) -> JobTimeout:
    return JobTimeout(
        f"{task.name} ran past its timeout of {task.timeout:g} s (attempt {job.attempt})"
    )


def classify(job: ClaimedJob, task: Task | None, error: BaseException, elapsed: float) -> Outcome:
    """Decide what an attempt that did not succeed means: snooze, retry after a delay, or dead."""
    if isinstance(error, Snooze):
        snooze = Failure(
            job_id=job.id,
            attempt=job.attempt,
            dead=False,
            retry_in=error.delay,
            last_error="",
            errors=job.errors,
            snooze=True,
        )
        return Outcome(job=job, failure=snooze, elapsed=elapsed)
    out_of_attempts = job.attempt >= job.max_attempts
    if isinstance(error, Retry):
        permanent = False
        delay = error.delay
    elif isinstance(error, PermanentError):
        permanent, delay = True, None
    elif isinstance(error, JobTimeout):
        permanent, delay = False, None
    else:
        permanent = task is not None and not _retryable(task, error)
        delay = None
    if delay is None:
        delay = _backoff_delay(task, job)
    message = _describe(error)
    details: dict[str, Any] = {"elapsed_seconds": round(elapsed, 6)}
    if not isinstance(error, Retry | _NoHandler | _PayloadMismatch | _BadResult | JobTimeout):
        details["traceback"] = _handler_traceback(error)[-_MAX_TRACEBACK_CHARS:]
    entry = error_entry(
        attempt=job.attempt,
        at=job.started_at + timedelta(seconds=elapsed),
        error=message,
        kind=_kind(error),
        details=details,
    )
    failure = Failure(
        job_id=job.id,
        attempt=job.attempt,
        dead=permanent or out_of_attempts,
        retry_in=max(0.0, delay),
        last_error=message,
        errors=[*job.errors, entry],
    )
    return Outcome(job=job, failure=failure, elapsed=elapsed)


def _backoff_delay(task: Task | None, job: ClaimedJob) -> float:
    """The task's backoff for this attempt; a backoff that raises retries at the default
    policy's delay instead (an outcome must always be decidable, or the job stays leased)."""
    if task is None:
        return 0.0
    try:
        return float(task.backoff.delay(job.attempt))
    except Exception:
        log.exception("the backoff of %s raised; using the default backoff", task.name)
        return as_backoff(None).delay(job.attempt)


def _retryable(task: Task, error: BaseException) -> bool:
    """The task's ``retry_on`` verdict (an error in the check itself means: retry)."""
    try:
        return task.retryable(error)
    except Exception:
        log.exception("checking retry_on of %s raised; retrying", task.name)
        return True


_INTERNAL_DIRS = (
    str(Path(__file__).resolve().parent),
    str(Path(asyncio.__file__).resolve().parent),
    str(Path(threading.__file__).resolve().parent / "concurrent"),
)


def _handler_traceback(error: BaseException) -> str:
    """The traceback from the handler's first frame on: sqlqueue's and asyncio's are noise."""
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        if not str(Path(tb.tb_frame.f_code.co_filename).resolve()).startswith(_INTERNAL_DIRS):
            break
        tb = tb.tb_next
    return storable("".join(traceback.format_exception(type(error), error, tb)))


def _kind(error: BaseException) -> str:
    if isinstance(error, _NoHandler):
        return "UnknownJobType"
    if isinstance(error, _PayloadMismatch):
        return "PayloadMismatch"
    if isinstance(error, _BadResult):
        return "ResultError"
    return type(error).__name__


def _describe(error: BaseException) -> str:
    try:
        text = str(error)
    except Exception:  # an exception whose __str__ fails still needs an outcome
        text = f"<unprintable {type(error).__name__}>"
    kind = _kind(error)
    message = f"{kind}: {text}" if text else kind
    return storable(message[:_MAX_ERROR_CHARS])


def storable(text: str) -> str:
    """``text`` as every backend can store it: NUL (PostgreSQL refuses it in text and JSON) and
    lone surrogates (not UTF-8: a path decoded with ``surrogateescape``) become escapes. An
    error message that cannot be written would otherwise fail its outcome's write for ever."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text
