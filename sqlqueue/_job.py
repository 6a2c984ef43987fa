"""The job as the public API sees it: a frozen snapshot of one row of ``sqlqueue_jobs``."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

__all__ = ["ErrorRecord", "Job", "JobStatus", "Progress"]


class JobStatus(enum.StrEnum):
    """Where a job is in its life; compares equal to its plain string (``"queued"`` …)."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    DEAD = "dead"
    CANCELLED = "cancelled"
    #: A workflow step whose upstream steps have not all finished: never claimed, not due.
    WAITING = "waiting"


#: States a worker may claim from (``failed`` waits for its ``next_run_at``).
CLAIMABLE: tuple[JobStatus, ...] = (JobStatus.QUEUED, JobStatus.FAILED)
#: States a job never leaves by itself.
TERMINAL: tuple[JobStatus, ...] = (JobStatus.SUCCEEDED, JobStatus.DEAD, JobStatus.CANCELLED)


@dataclass(frozen=True, kw_only=True)
class ErrorRecord:
    """One failed attempt: its number, when it ended (database clock) and what went wrong."""

    attempt: int
    at: datetime
    error: str
    kind: str
    details: Mapping[str, Any] | None = None


@dataclass(frozen=True, kw_only=True)
class Progress:
    """How far a running job says it got: ``done`` of ``total`` (if known), with a note."""

    done: float
    total: float | None
    note: str | None
    at: datetime


@dataclass(frozen=True, kw_only=True)
class Job:
    """A snapshot of one job row; read it with :meth:`sqlqueue.Queue.get_job`."""

    id: int
    job_type: str
    queue: str
    priority: int
    payload: Mapping[str, Any]
    status: JobStatus
    attempts: int
    max_attempts: int
    next_run_at: datetime
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    result: Any
    progress: Progress | None
    last_error: str | None
    errors: tuple[ErrorRecord, ...]
    idempotency_key: str | None
    group_key: str | None
    cancel_requested_at: datetime | None
    locked_by: str | None
    lease_expires_at: datetime | None
    requeued_from: int | None
    requeued_as: int | None
    requeued_at: datetime | None
    requeued_by: str | None
    requeue_reason: str | None
    #: A dead job a person marked handled without running it (``Queue.discard``).
    discarded_at: datetime | None = None
    discarded_by: str | None = None
    discard_reason: str | None = None
    #: The batch the job belongs to, or completes as its callback (``Queue.enqueue_batch``).
    batch_id: int | None = None
    #: Its labels (``tags=`` at enqueue and on its task), sorted; read by ``get_job`` only.
    tags: tuple[str, ...] = ()
    #: When it is cancelled unless started (``expires_in``/``expires_at``); ``None``: never.
    expires_at: datetime | None = None
    #: The digest of its ``sqlqueue.Unique`` key; ``None`` when it is not unique.
    unique_key: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready values: times in ISO 8601, the status as its name."""
        return _plain(dataclasses.asdict(self))  # type: ignore[no-any-return]


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value
