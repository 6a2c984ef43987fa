"""sqlqueue: reliable background jobs on the SQLAlchemy database you already have.

Enqueue in your own transaction, run handlers in worker processes, retry with backoff, and
look at what died — on SQLite or PostgreSQL, with the same code.

Each public name is imported from its module when first used (PEP 562): ``import sqlqueue``
itself loads nothing else, so ``sqlqueue --version`` and ``--help`` answer without SQLAlchemy
and the database drivers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sqlqueue._batch import Batch, BatchStatus
    from sqlqueue._context import JobContext
    from sqlqueue._errors import (
        ConfigurationError,
        DatabaseError,
        DatabaseRefused,
        DatabaseUnavailable,
        EnqueueError,
        HandlerSignal,
        JobNotFound,
        JobStateError,
        JobTimeout,
        PayloadError,
        PermanentError,
        Retry,
        SchemaNotMigrated,
        Snooze,
        SqlqueueError,
        UnknownJobType,
        UnsupportedDatabase,
        WorkflowError,
    )
    from sqlqueue._job import ErrorRecord, Job, JobStatus, Progress
    from sqlqueue._job_action import JobAction
    from sqlqueue._logs import JobLogFilter, JsonLogFormatter
    from sqlqueue._migrate import migrate
    from sqlqueue._operators.stats import (
        Activity,
        Alarm,
        ErrorCount,
        Health,
        MinuteActivity,
        QueueStats,
        Stats,
    )
    from sqlqueue._policies.backoff import Backoff, exponential, linear, schedule
    from sqlqueue._policies.circuit_breaker import CircuitBreaker
    from sqlqueue._policies.concurrency import Concurrency
    from sqlqueue._policies.rate_limit import RateLimit
    from sqlqueue._policies.retention import Retention
    from sqlqueue._queue import Queue
    from sqlqueue._task import JobRequest, Task, TaskCall
    from sqlqueue._unique import Unique
    from sqlqueue._worker.loop import Worker
    from sqlqueue._worker_info import WorkerInfo
    from sqlqueue._workflow import StepStatus, Workflow, WorkflowHandle, WorkflowStatus
    from sqlqueue._workflow_summary import WorkflowSummary

__all__ = [
    "Activity",
    "Alarm",
    "Backoff",
    "Batch",
    "BatchStatus",
    "CircuitBreaker",
    "Concurrency",
    "ConfigurationError",
    "DatabaseError",
    "DatabaseRefused",
    "DatabaseUnavailable",
    "EnqueueError",
    "ErrorCount",
    "ErrorRecord",
    "HandlerSignal",
    "Health",
    "Job",
    "JobAction",
    "JobContext",
    "JobLogFilter",
    "JobNotFound",
    "JobRequest",
    "JobStateError",
    "JobStatus",
    "JobTimeout",
    "JsonLogFormatter",
    "MinuteActivity",
    "PayloadError",
    "PermanentError",
    "Progress",
    "Queue",
    "QueueStats",
    "RateLimit",
    "Retention",
    "Retry",
    "SchemaNotMigrated",
    "Snooze",
    "SqlqueueError",
    "Stats",
    "StepStatus",
    "Task",
    "TaskCall",
    "Unique",
    "UnknownJobType",
    "UnsupportedDatabase",
    "Worker",
    "WorkerInfo",
    "Workflow",
    "WorkflowError",
    "WorkflowHandle",
    "WorkflowStatus",
    "WorkflowSummary",
    "exponential",
    "linear",
    "migrate",
    "schedule",
]

__version__ = "0.1.0"

#: The module each public name lives in, imported when the name is first used.
_HOMES: dict[str, tuple[str, ...]] = {
    "sqlqueue._batch": ("Batch", "BatchStatus"),
    "sqlqueue._context": ("JobContext",),
    "sqlqueue._errors": (
        "ConfigurationError",
        "DatabaseError",
        "DatabaseRefused",
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
    ),
    "sqlqueue._job": ("ErrorRecord", "Job", "JobStatus", "Progress"),
    "sqlqueue._job_action": ("JobAction",),
    "sqlqueue._logs": ("JobLogFilter", "JsonLogFormatter"),
    "sqlqueue._migrate": ("migrate",),
    "sqlqueue._operators.stats": (
        "Activity",
        "Alarm",
        "ErrorCount",
        "Health",
        "MinuteActivity",
        "QueueStats",
        "Stats",
    ),
    "sqlqueue._policies.backoff": ("Backoff", "exponential", "linear", "schedule"),
    "sqlqueue._policies.circuit_breaker": ("CircuitBreaker",),
    "sqlqueue._policies.concurrency": ("Concurrency",),
    "sqlqueue._policies.rate_limit": ("RateLimit",),
    "sqlqueue._policies.retention": ("Retention",),
    "sqlqueue._queue": ("Queue",),
    "sqlqueue._task": ("JobRequest", "Task", "TaskCall"),
    "sqlqueue._unique": ("Unique",),
    "sqlqueue._worker.loop": ("Worker",),
    "sqlqueue._worker_info": ("WorkerInfo",),
    "sqlqueue._workflow": ("StepStatus", "Workflow", "WorkflowHandle", "WorkflowStatus"),
    "sqlqueue._workflow_summary": ("WorkflowSummary",),
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}


def __getattr__(name: str) -> object:
    """A public name, imported from its module on first use (then kept here)."""
    module = _HOME_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'sqlqueue' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """Every public name, loaded yet or not (for ``dir()`` and an editor's completion)."""
    return sorted({*globals(), *__all__})
