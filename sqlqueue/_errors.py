"""The one exception hierarchy of sqlqueue.

Everything sqlqueue raises derives from :class:`SqlqueueError`::

    SqlqueueError
    ├── ConfigurationError        a setting is wrong (raised at construction, names the field)
    ├── EnqueueError              nothing was written; the caller's transaction is still usable
    │   ├── PayloadError          not plain JSON, over the size cap, or not the handler's arguments
    │   ├── UnknownJobType        no task of that name on this queue
    │   └── WorkflowError         a workflow's steps do not form a valid graph
    ├── JobStateError             the job is not in a state that allows the operation
    │   └── JobNotFound           there is no job with that id
    ├── DatabaseError             a driver error, translated at the dialect boundary
    │   ├── DatabaseUnavailable   cannot connect, or the connection dropped
    │   ├── SchemaNotMigrated     sqlqueue's tables are missing: run ``sqlqueue migrate``
    │   └── UnsupportedDatabase   the database lacks something sqlqueue needs
    └── HandlerSignal             raised *by handlers* to steer the outcome of an attempt
        ├── Retry                 try again later (counts as an attempt)
        ├── Snooze                run again later, NOT counting this attempt
        ├── PermanentError        do not retry: straight to dead
        └── JobTimeout            the attempt ran past its task's timeout (raised by the worker)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlqueue._moments import delay_problem

__all__ = [
    "ConfigurationError",
    "DatabaseError",
    "DatabaseUnavailable",
    "EnqueueError",
    "HandlerSignal",
    "JobNotFound",
    "JobStateError",
    "JobTimeout",
    "PayloadError",
    "PermanentError",
    "Retry",
    "SchemaNotMigrated",
    "Snooze",
    "SqlqueueError",
    "UnknownJobType",
    "UnsupportedDatabase",
    "WorkflowError",
]


class SqlqueueError(Exception):
    """Root of every error sqlqueue raises."""


class ConfigurationError(SqlqueueError, ValueError):
    """A setting given to sqlqueue is invalid; the message names the field."""


class EnqueueError(SqlqueueError):
    """A job could not be enqueued; no row was written."""


class PayloadError(EnqueueError, ValueError):
    """The payload is not a JSON object of plain values, is larger than the cap, or does not
    bind to its task's handler (a missing argument, an unknown keyword)."""


class UnknownJobType(EnqueueError, LookupError):
    """No task of that name on this queue (``external=True`` if another service runs it)."""


class JobStateError(SqlqueueError):
    """The job is not in a state that allows the requested operation."""


class JobNotFound(JobStateError, LookupError):
    """No job has the given id (it never existed, or was pruned)."""


class DatabaseError(SqlqueueError):
    """A database driver error, translated into sqlqueue's terms."""


class DatabaseUnavailable(DatabaseError):
    """The database cannot be reached or the connection was lost; retrying later may succeed."""


class DatabaseRefused(DatabaseError):
    """The database refused a statement for the values in it (out of range, too long, a
    constraint, a character it cannot store): sending it again unchanged cannot succeed, so
    a worker never retries such a write for ever (see ``Dialect.translate_error``)."""


class SchemaNotMigrated(DatabaseError):
    """sqlqueue's tables do not exist (or are older than this code): run ``sqlqueue migrate``."""


class UnsupportedDatabase(DatabaseError):
    """The database (or its version) lacks a feature sqlqueue needs."""


class HandlerSignal(SqlqueueError):
    """Base of the exceptions a handler raises to choose what happens to the job.

    ``details`` (given to :class:`Retry` or :class:`PermanentError`) is a JSON-able mapping the
    worker stores in this attempt's entry of the job's error history (``ErrorRecord.details``):
    the facts an operator wants next to the message, such as an HTTP status and a body excerpt.
    """

    details: Mapping[str, Any] | None = None


class Retry(HandlerSignal):
    """Ask for another attempt after ``delay`` seconds (or the task's backoff when ``None``).

    The attempt still counts: when none are left the job goes to ``dead``.
    """

    def __init__(
        self,
        delay: float | None = None,
        reason: str = "retry requested",
        *,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(reason)
        self.delay = None if delay is None else _rerun_delay("Retry.delay", delay)
        self.reason = reason
        self.details = details


class Snooze(HandlerSignal):
    """Run the job again after ``delay`` seconds without counting this attempt (not an error:
    nothing is added to the error history). For "not yet" rather than "failed"."""

    def __init__(self, delay: float, reason: str = "snoozed") -> None:
        super().__init__(reason)
        self.delay = _rerun_delay("Snooze.delay", delay)
        self.reason = reason


def _rerun_delay(field: str, value: object) -> float:
    """``value`` if a delay whose run time every backend stores, else ``ConfigurationError``
    naming ``field``: checked where the handler makes the signal, for a delay the outcome write
    could not store wedged the worker's every outcome."""
    problem = delay_problem(field, value)
    if problem is not None:
        raise ConfigurationError(problem)
    assert isinstance(value, int | float)
    return float(value)


class PermanentError(HandlerSignal):
    """Retrying cannot help (bad input, a 4xx answer …): the job goes straight to ``dead``."""

    def __init__(self, *args: object, details: Mapping[str, Any] | None = None) -> None:
        super().__init__(*args)
        self.details = details


class JobTimeout(HandlerSignal):
    """The attempt ran past its task's ``timeout``; it fails and is retried like an error."""


class WorkflowError(EnqueueError, ValueError):
    """A workflow cannot be written as given (a repeated or unknown step name, a cycle, an empty
    workflow, a bad ``on_dead``); raised before any SQL, so nothing was written."""
