"""sqlqueue: reliable background jobs on the SQLAlchemy database you already have.

Enqueue in your own transaction, run handlers in worker processes, retry with backoff, and
look at what died — on SQLite or PostgreSQL, with the same code.
"""

from sqlqueue._batch import Batch, BatchStatus
from sqlqueue._context import JobContext
from sqlqueue._errors import (
    ConfigurationError,
    DatabaseError,
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
