"""A sqlqueue job of the Tasks framework read back as the framework's ``TaskResult``.

The job row holds what the framework asks for: the task's path, its arguments and backend
in the payload; the queue, the (mirrored) priority and the due time in their columns; the
return value as the job's result; each failed attempt's error and traceback in the error
history. Times are the database's clock, as everywhere in sqlqueue.
"""

from __future__ import annotations

import builtins
import re
from datetime import datetime
from typing import Any

from django.core.exceptions import SuspiciousOperation
from django.utils.module_loading import import_string

import sqlqueue
from sqlqueue import ErrorRecord, Job, JobStatus
from sqlqueue.django._tasks_framework import Task, TaskError, TaskResult, TaskResultStatus

__all__ = [
    "JOB_TYPE",
    "django_priority",
    "sqlqueue_priority",
    "task_at",
    "task_error",
    "task_result",
    "task_status",
]

#: The job type of every Tasks-framework job: the payload names the task to run.
JOB_TYPE = "django.tasks"

#: sqlqueue's job states as the framework's. A failed attempt with attempts left is ``READY``
#: ("ready to be executed again"); a job that ended without running (cancelled, expired) is
#: ``FAILED``, which the framework defines as "unable to start" too.
_STATUS: dict[JobStatus, Any] = {
    JobStatus.QUEUED: TaskResultStatus.READY,
    JobStatus.WAITING: TaskResultStatus.READY,
    JobStatus.FAILED: TaskResultStatus.READY,
    JobStatus.RUNNING: TaskResultStatus.RUNNING,
    JobStatus.SUCCEEDED: TaskResultStatus.SUCCESSFUL,
    JobStatus.DEAD: TaskResultStatus.FAILED,
    JobStatus.CANCELLED: TaskResultStatus.FAILED,
}
_FINISHED = frozenset({TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED})


def sqlqueue_priority(priority: int) -> int:
    """Django's priority (higher runs first, -100..100) as sqlqueue's (lower runs first)."""
    return -priority


def django_priority(priority: int) -> int:
    """The inverse of :func:`sqlqueue_priority`."""
    return -priority


def task_status(status: JobStatus) -> Any:
    """The framework's status of a job in ``status``."""
    return _STATUS[status]


def task_at(path: str) -> Task[Any, Any]:
    """The module-level ``Task`` named ``path`` (``module.function``)."""
    found = import_string(path)
    if not isinstance(found, Task):
        raise SuspiciousOperation(f"{path!r} is {type(found).__name__}, not a Task")
    return found


def task_result(job: Job) -> TaskResult[Any]:
    """The framework's view of ``job``, a job of :data:`JOB_TYPE`."""
    payload = job.payload
    run_after = payload.get("run_after")
    task = task_at(payload["task"]).using(
        priority=django_priority(job.priority),
        queue_name=job.queue,
        run_after=datetime.fromisoformat(run_after) if run_after else None,
        backend=payload["backend"],
    )
    status = _STATUS[job.status]
    result: TaskResult[Any] = TaskResult(
        task=task,
        id=str(job.id),
        status=status,
        enqueued_at=job.created_at,
        started_at=job.started_at,
        last_attempted_at=job.started_at,
        finished_at=job.finished_at if status in _FINISHED else None,
        args=payload["args"],
        kwargs=payload["kwargs"],
        backend=payload["backend"],
        errors=[task_error(record) for record in job.errors],
        # sqlqueue keeps the worker of the last attempt only: one entry per attempt, so that
        # the framework's ``attempts`` (their count) is the job's.
        worker_ids=[job.locked_by or ""] * job.attempts,
    )
    if status == TaskResultStatus.SUCCESSFUL:
        object.__setattr__(result, "_return_value", job.result)
    return result


def task_error(record: ErrorRecord) -> Any:
    """One failed attempt as the framework's ``TaskError``: the exception's class path and the
    traceback the worker stored (sqlqueue's own text where there is none: a timeout, a lease
    that expired)."""
    details = record.details or {}
    traceback = details.get("traceback")
    if not isinstance(traceback, str):
        return TaskError(exception_class_path=_class_path(record.kind, ""), traceback=record.error)
    return TaskError(exception_class_path=_class_path(record.kind, traceback), traceback=traceback)


def _class_path(kind: str, traceback: str) -> str:
    """The dotted path of the exception class named ``kind``: Python's traceback ends with
    ``module.Class: message`` (the module left out for builtins), which the worker stored;
    sqlqueue's own kinds (``JobTimeout`` …) are its public errors."""
    lines = re.findall(rf"^((?:[\w.]+\.)?{re.escape(kind)})(?::|$)", traceback, re.MULTILINE)
    if lines and "." in lines[-1]:
        return str(lines[-1])
    if hasattr(builtins, kind):
        return f"builtins.{kind}"
    if hasattr(sqlqueue, kind):
        return f"sqlqueue.{kind}"
    return kind
