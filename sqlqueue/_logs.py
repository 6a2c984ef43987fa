"""Logs a machine can read: the job fields on a worker's records, and a JSON line formatter.

While a worker runs, two context variables say for whom the current code runs: the worker
(set on its event loop and in its threads) and the job (set around each handler call). Setting
them costs a context-variable write per job; nothing reads them until a record is emitted
through a handler that carries :class:`JobLogFilter`, which copies ``worker_id`` and, inside a
job, ``job_id``, ``job_type``, ``queue`` and ``attempt`` onto the record as ``extra`` fields. So
a handler's own ``logging.getLogger(...)`` records carry them too, and a worker that nobody
logs from pays nothing else.

sqlqueue never adds a handler itself: ``sqlqueue worker`` configures logging for its process
(``--log-format text|json``), and an app that runs workers its own way adds the filter (and,
if it wants JSON, :class:`JsonLogFormatter`) to its handlers.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any, Literal

from sqlqueue._store.rows import ClaimedJob

__all__ = [
    "JobLogFilter",
    "JsonLogFormatter",
    "configure_logging",
    "current_job",
    "current_worker",
    "job_fields",
    "worker_scope",
]

#: The job whose handler the current code runs in (set around each handler call).
current_job: ContextVar[ClaimedJob | None] = ContextVar("sqlqueue_job", default=None)
#: The id of the worker the current code runs for (its event loop and its threads).
current_worker: ContextVar[str | None] = ContextVar("sqlqueue_worker", default=None)

#: The attributes every ``LogRecord`` has: anything else on a record came as ``extra``.
_RECORD_ATTRIBUTES = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "taskName",
}

LogFormat = Literal["text", "json"]
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def job_fields(job: ClaimedJob, worker_id: str | None) -> dict[str, Any]:
    """The ``extra`` fields of a record about ``job``, as every sqlqueue record spells them."""
    return {
        "job_id": job.id,
        "job_type": job.job_type,
        "queue": job.queue,
        "attempt": job.attempt,
        "worker_id": worker_id,
    }


@contextmanager
def worker_scope(worker_id: str) -> Iterator[None]:
    """Records logged inside carry ``worker_id`` (through :class:`JobLogFilter`)."""
    token = current_worker.set(worker_id)
    try:
        yield
    finally:
        current_worker.reset(token)


class JobLogFilter(logging.Filter):
    """Adds ``worker_id`` and, inside a job, ``job_id``, ``job_type``, ``queue`` and
    ``attempt`` to every record that passes the handler it is attached to.

    Attach it to a *handler* (a logger's filters do not see records of its children). Fields
    a record already has (a call's own ``extra``) are kept. ``worker_id`` is the fallback for
    records logged where no worker is current (``sqlqueue worker`` sets it: one per process).
    """

    def __init__(self, worker_id: str | None = None) -> None:
        super().__init__()
        self.worker_id = worker_id

    def filter(self, record: logging.LogRecord) -> bool:
        """Copy the current worker's and job's fields onto ``record``; never drops it."""
        fields = record.__dict__
        job = current_job.get()
        worker_id = current_worker.get() or self.worker_id
        if job is not None:
            for name, value in job_fields(job, worker_id).items():
                fields.setdefault(name, value)
        elif worker_id is not None:
            fields.setdefault("worker_id", worker_id)
        return True


class JsonLogFormatter(logging.Formatter):
    """One JSON object per record: ``timestamp`` (UTC, ISO 8601), ``level``, ``logger``,
    ``message``, every ``extra`` field, and ``exception`` / ``stack`` text when there is one.
    Values JSON cannot hold are written as their ``str``."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON."""
        document: dict[str, Any] = {
            "timestamp": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name, value in record.__dict__.items():
            if name not in _RECORD_ATTRIBUTES and name not in document:
                document[name] = value
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            document["exception"] = record.exc_text
        if record.stack_info:
            document["stack"] = self.formatStack(record.stack_info)
        return json.dumps(document, default=str, ensure_ascii=False)


def configure_logging(level: str, log_format: LogFormat) -> JobLogFilter:
    """Log to stderr at ``level`` in ``log_format`` with the job fields (``sqlqueue``'s own
    command does this for its process; the library never does). Returns the filter, whose
    ``worker_id`` the caller sets once it knows the worker."""
    handler = logging.StreamHandler()
    formatter = JsonLogFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    handler.setFormatter(formatter)
    job_filter = JobLogFilter()
    handler.addFilter(job_filter)
    logging.basicConfig(level=level, handlers=[handler])
    return job_filter
