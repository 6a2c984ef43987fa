"""Turning whatever one attempt did into its outcome: success, or a failure that snoozes,
retries after a delay, or goes to dead.

The outcome set is closed and :func:`classify` is the one function that decides it. It must
not fail itself (an unprintable exception, a raising backoff): an attempt without an outcome
would keep its job's slot and lease for as long as the worker lives.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import traceback
from dataclasses import dataclass, fields
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlqueue._errors import HandlerSignal, JobTimeout, PermanentError, Retry, Snooze
from sqlqueue._moments import delay_problem
from sqlqueue._policies.backoff import as_backoff
from sqlqueue._scrub import clip, storable
from sqlqueue._secrets import Redactor, SecretKeyMissing
from sqlqueue._store.rows import ClaimedJob, Failure, error_entry
from sqlqueue._task import Task

__all__ = [
    "OUTCOMES",
    "BadResult",
    "NoHandler",
    "Outcome",
    "PayloadMismatch",
    "classify",
    "outcome_name",
    "storable",
    "succeeded",
    "unstorable",
]

log = logging.getLogger("sqlqueue.worker")

_MAX_TRACEBACK_CHARS = 8_000
_MAX_ERROR_CHARS = 2_000
_MAX_DETAILS_CHARS = 8_000


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """What one attempt produced: ``failure`` is ``None`` when the handler succeeded.

    ``recorded`` means the success was already written in the handler's own transaction
    (``landed`` says whether the lease still held); otherwise the completer writes it.
    ``claimable``: the queues in which that transaction made jobs claimable (workflow steps
    it released, a batch's callback).
    """

    job: ClaimedJob
    failure: Failure | None
    elapsed: float
    result: Any = None
    recorded: bool = False
    landed: bool = False
    claimable: frozenset[str] = frozenset()

    @property
    def succeeded(self) -> bool:
        """Whether the attempt succeeded."""
        return self.failure is None


_new = object.__new__
_put = object.__setattr__
_SUCCESS_FIELDS = ("job", "failure", "elapsed", "result", "recorded", "landed", "claimable")
if set(_SUCCESS_FIELDS) != {field.name for field in fields(Outcome)}:  # pragma: no cover
    raise RuntimeError("succeeded() must fill every field of Outcome: add the new one there")


def succeeded(
    job: ClaimedJob,
    elapsed: float,
    result: Any = None,
    *,
    recorded: bool = False,
    landed: bool = False,
    claimable: frozenset[str] = frozenset(),
) -> Outcome:
    """The :class:`Outcome` of an attempt that succeeded, its fields set with
    ``object.__setattr__`` bound once as the claim reader sets a claimed job's (see
    ``sqlqueue/_store/rows.py``): the frozen dataclass's ``__init__`` looks the builtin up
    again for each of the seven, about a microsecond of the event loop per job, and every
    job that succeeds pays it."""
    outcome = _new(Outcome)
    _put(outcome, "job", job)
    _put(outcome, "failure", None)
    _put(outcome, "elapsed", elapsed)
    _put(outcome, "result", result)
    _put(outcome, "recorded", recorded)
    _put(outcome, "landed", landed)
    _put(outcome, "claimable", claimable)
    return outcome


#: What became of a written attempt, by name: the ``outcome`` label of the metrics and the
#: ``sqlqueue.outcome`` attribute of its span.
OUTCOMES = ("succeeded", "failed", "dead", "snoozed", "cancelled")


def outcome_name(outcome: Outcome, cancel_requested: bool) -> str:
    """The name of a written attempt's outcome, as the store decided it: a failure with
    attempts left ends ``cancelled`` when someone asked to cancel the job while it ran."""
    failure = outcome.failure
    if failure is None:
        return "succeeded"
    if failure.snooze:
        return "snoozed"
    if failure.dead:
        return "dead"
    return "cancelled" if cancel_requested else "failed"


class NoHandler(PermanentError):
    """The worker has no task for the job's type."""


class PayloadMismatch(PermanentError):
    """The payload does not fit the handler's signature."""


class BadResult(PermanentError):
    """The handler returned something that cannot be stored as the job's result."""


def classify(job: ClaimedJob, task: Task | None, error: BaseException, elapsed: float) -> Outcome:
    """Decide what an attempt that did not succeed means: snooze, retry after a delay, or dead.

    The outcome keeps the error's text, never its frames: they are cleared here (see
    :func:`_release_frames`)."""
    try:
        return _decide(job, task, error, elapsed)
    finally:
        _release_frames(error)


def _release_frames(error: BaseException) -> None:
    """Clear the finished frames of ``error``'s traceback (and of the errors it chains), so the
    handler's locals go now, not at some later garbage collection. A handler that raised in the
    middle of a query left its open cursor there: on SQLite that cursor keeps its pooled
    connection's read snapshot, and the next job given the connection reads old rows and
    cannot write. Frames still running are left as they are (``clear_frames`` skips them)."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [error]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        try:
            traceback.clear_frames(current.__traceback__)
        except Exception:  # never fail an outcome over housekeeping (see the module)
            log.debug("could not clear the frames of an attempt's error", exc_info=True)
        pending.extend((current.__cause__, current.__context__))


def _decide(job: ClaimedJob, task: Task | None, error: BaseException, elapsed: float) -> Outcome:
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
    try:
        message, details = _texts(job, task, error, elapsed)
    except Exception as scrubbing:  # its type only: its message might quote what it read
        log.error(
            "could not scrub the secrets of job %d from its error (%s)",
            job.id,
            type(scrubbing).__name__,
        )
        message = f"{_kind(error)} (not stored: its secrets could not be scrubbed)"
        details = {"elapsed_seconds": round(elapsed, 6)}
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


def unstorable(outcome: Outcome, refusal: str) -> Outcome:
    """What to write instead of ``outcome`` when the database refused it for its values
    (``refusal``, the driver's first line) time after time: a failure that names the
    refusal, with nothing of the handler's in it (its result, details, delay), so that this
    one is storable. A handler that succeeded ends ``dead``: its work is done and running it
    again could repeat it; a person decides. Otherwise the attempt failed: retried after the
    default backoff, dead when it was the last."""
    job = outcome.job
    original = outcome.failure
    if original is None:
        what = "the handler succeeded, but its outcome could not be stored"
    elif original.snooze:
        what = "the outcome could not be stored (a snooze)"
    else:
        kind = original.errors[-1].get("kind") if original.errors else None
        what = f"the outcome could not be stored (a failure: {kind or 'an error'})"
    message = clip(storable(f"{what}: {refusal}"), _MAX_ERROR_CHARS)
    entry = error_entry(
        attempt=job.attempt,
        at=job.started_at + timedelta(seconds=outcome.elapsed),
        error=message,
        kind="OutcomeNotStored",
        details={"elapsed_seconds": round(outcome.elapsed, 6)},
    )
    failure = Failure(
        job_id=job.id,
        attempt=job.attempt,
        dead=original is None or job.attempt >= job.max_attempts,
        retry_in=as_backoff(None).delay(job.attempt),
        last_error=message,
        errors=[*job.errors, entry],
    )
    return Outcome(job=job, failure=failure, elapsed=outcome.elapsed)


def _texts(
    job: ClaimedJob, task: Task | None, error: BaseException, elapsed: float
) -> tuple[str, dict[str, Any]]:
    """The stored message and details of a failed attempt: every text in them redacted of the
    job's secrets first and only then cut to length (:func:`~sqlqueue._scrub.clip`), so a
    secret never survives in part at a cut."""
    redactor = None
    if task is not None and task.secrets is not None:
        redactor = task.secrets.redactor(job.payload)
    message = _describe(error, redactor)
    details: dict[str, Any] = {
        **_signal_details(error, redactor),
        "elapsed_seconds": round(elapsed, 6),
    }
    if not isinstance(
        error, Retry | NoHandler | PayloadMismatch | BadResult | JobTimeout | SecretKeyMissing
    ):
        details["traceback"] = clip(
            _handler_traceback(error), _MAX_TRACEBACK_CHARS, redactor=redactor, keep="tail"
        )
    return message, details


def _signal_details(error: BaseException, redactor: Redactor | None) -> dict[str, Any]:
    """The ``details`` a handler attached to its :class:`Retry` or :class:`PermanentError`,
    redacted (keys and values, of every type: see :meth:`Redactor.value`) and only then made
    storable; a note instead when they are not JSON or too large (never an exception: the
    attempt must still get its outcome)."""
    details = getattr(error, "details", None) if isinstance(error, HandlerSignal) else None
    if details is None:
        return {}
    try:
        plain = dict(details)
        if redactor is not None:
            plain = redactor.value(plain)
    except Exception:
        return {"details_unstorable": _describe_value(details, redactor)}
    try:
        stored = _storable_json(plain, redactor)
        encoded = json.dumps(stored, allow_nan=False, ensure_ascii=False)
    except Exception:  # described from the redacted copy: its repr holds no secret's bytes
        return {"details_unstorable": _describe_value(plain, redactor)}
    if len(encoded) > _MAX_DETAILS_CHARS:  # one entry per attempt: keep the history small
        return {"details_truncated": clip(encoded, _MAX_DETAILS_CHARS, redactor=redactor)}
    assert isinstance(stored, dict)
    return stored


def _storable_json(value: Any, redactor: Redactor | None) -> Any:
    """``value`` with every string made :func:`storable` (PostgreSQL's JSON refuses NUL), and
    every key a string: one that is not is ``str()``-ed, which its redaction came before (and
    the text is scrubbed once more, for a key whose ``str`` says more than its ``repr``)."""
    if isinstance(value, str):
        return storable(value)
    if isinstance(value, dict):
        return {
            _storable_key(key, redactor): _storable_json(item, redactor)
            for key, item in value.items()
        }
    if isinstance(value, list | tuple):
        return [_storable_json(item, redactor) for item in value]
    return value


def _storable_key(key: Any, redactor: Redactor | None) -> str:
    if isinstance(key, str):
        return storable(key)
    text = str(key)
    return storable(text if redactor is None else redactor.text(text))


def _describe_value(value: Any, redactor: Redactor | None) -> str:
    try:
        text = repr(value)
    except Exception:
        text = f"<unprintable {type(value).__name__}>"
    return clip(text, _MAX_ERROR_CHARS, redactor=redactor)


def _backoff_delay(task: Task | None, job: ClaimedJob) -> float:
    """The task's backoff for this attempt; a backoff that raises, or asks for a delay the
    database cannot store (NaN, infinite, past the year 9999), retries at the default
    policy's delay instead (an outcome must always be decidable and storable, or the job
    stays leased)."""
    if task is None:
        return 0.0
    try:
        delay = task.backoff.delay(job.attempt)
        problem = delay_problem(f"the backoff of {task.name}", delay)
        if problem is not None:
            raise ValueError(problem)
        return float(delay)
    except Exception:
        log.exception("the backoff of %s failed; using the default backoff", task.name)
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
    str(Path(__file__).resolve().parent.parent / "_tracing.py"),
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
    if isinstance(error, NoHandler):
        return "UnknownJobType"
    if isinstance(error, PayloadMismatch):
        return "PayloadMismatch"
    if isinstance(error, BadResult):
        return "ResultError"
    return type(error).__name__


def _describe(error: BaseException, redactor: Redactor | None = None) -> str:
    try:
        text = str(error)
    except Exception:  # an exception whose __str__ fails still needs an outcome
        text = f"<unprintable {type(error).__name__}>"
    kind = _kind(error)
    message = f"{kind}: {text}" if text else kind
    return clip(message, _MAX_ERROR_CHARS, redactor=redactor)
