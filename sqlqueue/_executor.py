"""Running one attempt of one job, and turning whatever happened into an outcome.

The outcome set is closed: the handler succeeded, or the attempt failed and the job either
retries at a given delay or goes to dead. :func:`classify` is the one function that decides.
"""

from __future__ import annotations

import asyncio
import threading
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlqueue._errors import JobTimeout, PermanentError, Retry
from sqlqueue._store.rows import ClaimedJob, Failure, error_entry
from sqlqueue._task import Task
from sqlqueue._threads import HandlerThreads

__all__ = ["Outcome", "classify", "execute"]

_MAX_TRACEBACK_CHARS = 8_000
_MAX_ERROR_CHARS = 2_000


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """What one attempt produced: ``failure`` is ``None`` when the handler succeeded."""

    job: ClaimedJob
    failure: Failure | None
    elapsed: float

    @property
    def succeeded(self) -> bool:
        """Whether the attempt succeeded."""
        return self.failure is None


class _NoHandler(PermanentError):
    """The worker has no task for the job's type."""


class _PayloadMismatch(PermanentError):
    """The payload does not fit the handler's signature."""


async def execute(
    job: ClaimedJob, task: Task | None, threads: HandlerThreads, known: list[str]
) -> Outcome:
    """Run ``job`` with its task's handler (sync in ``threads``, async on this loop)."""
    started = time.monotonic()
    try:
        if task is None:
            raise _NoHandler(
                f"no handler for job type {job.job_type!r} in this worker "
                f"(it knows: {', '.join(known) or 'nothing'}); register the task or run a worker "
                "that has it, then requeue this job"
            )
        _check_arguments(task, job)
        await _call(task, job, threads)
    except asyncio.CancelledError:
        raise
    except BaseException as error:
        return classify(job, task, error, time.monotonic() - started)
    return Outcome(job=job, failure=None, elapsed=time.monotonic() - started)


def _check_arguments(task: Task, job: ClaimedJob) -> None:
    try:
        task.signature.bind(**job.payload)
    except TypeError as error:
        parameters = ", ".join(
            str(p.replace(annotation=p.empty)) for p in task.signature.parameters.values()
        )
        raise _PayloadMismatch(
            f"the payload does not fit {task.name}({parameters}): {error}"
        ) from None


async def _call(task: Task, job: ClaimedJob, threads: HandlerThreads) -> Any:
    timeout = task.timeout
    if task.is_async:
        coroutine = task.handler(**job.payload)
        try:
            return await asyncio.wait_for(coroutine, timeout)
        except TimeoutError:
            raise _timed_out(task, job) from None
    ticket = threads.submit(lambda: task.handler(**job.payload))
    try:
        return await asyncio.wait_for(asyncio.shield(ticket.future), timeout)
    except TimeoutError:
        threads.abandon(ticket)
        raise _timed_out(task, job) from None
    except asyncio.CancelledError:
        threads.abandon(ticket)
        raise


def _timed_out(task: Task, job: ClaimedJob) -> JobTimeout:
    return JobTimeout(
        f"{task.name} ran past its timeout of {task.timeout:g} s (attempt {job.attempt})"
    )


def classify(job: ClaimedJob, task: Task | None, error: BaseException, elapsed: float) -> Outcome:
    """Decide what a failed attempt means: retry after a delay, or dead."""
    out_of_attempts = job.attempt >= job.max_attempts
    if isinstance(error, Retry):
        permanent = False
        delay = error.delay
    elif isinstance(error, PermanentError):
        permanent, delay = True, None
    elif isinstance(error, JobTimeout):
        permanent, delay = False, None
    else:
        permanent = task is not None and not task.retryable(error)
        delay = None
    if delay is None:
        delay = task.backoff.delay(job.attempt) if task is not None else 0.0
    message = _describe(error)
    details: dict[str, Any] = {"elapsed_seconds": round(elapsed, 6)}
    if not isinstance(error, Retry | _NoHandler | _PayloadMismatch | JobTimeout):
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
    return "".join(traceback.format_exception(type(error), error, tb))


def _kind(error: BaseException) -> str:
    if isinstance(error, _NoHandler):
        return "UnknownJobType"
    if isinstance(error, _PayloadMismatch):
        return "PayloadMismatch"
    return type(error).__name__


def _describe(error: BaseException) -> str:
    text = str(error)
    kind = _kind(error)
    message = f"{kind}: {text}" if text else kind
    return message[:_MAX_ERROR_CHARS]
