"""Values that cross the store boundary: claimed jobs, failures, and rows turned into ``Job``."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import RowMapping

from sqlqueue._job import ErrorRecord, Job, JobStatus, Progress

__all__ = [
    "CLAIM_COLUMNS",
    "ClaimedJob",
    "Failure",
    "as_utc",
    "claims_from_rows",
    "error_entry",
    "row_to_job",
]

#: What a claim returns, in this order (``claims_from_rows`` reads the rows by position).
CLAIM_COLUMNS = (
    "id",
    "job_type",
    "queue",
    "priority",
    "payload",
    "attempts",
    "max_attempts",
    "errors",
    "created_at",
    "started_at",
    "lease_expires_at",
)


@dataclass(frozen=True, kw_only=True)
class ClaimedJob:
    """A job leased to a worker; ``attempt`` (with ``id``) is the fence for its transitions."""

    id: int
    job_type: str
    queue: str
    priority: int
    payload: Mapping[str, Any]
    attempt: int
    max_attempts: int
    errors: tuple[Mapping[str, Any], ...]
    created_at: datetime
    started_at: datetime
    lease_expires_at: datetime

    @property
    def fence(self) -> tuple[int, int]:
        """The (id, attempt) pair that identifies this lease."""
        return (self.id, self.attempt)


@dataclass(frozen=True, kw_only=True)
class Failure:
    """The outcome of a failed attempt, ready to be written: retry later, or dead."""

    job_id: int
    attempt: int
    dead: bool
    retry_in: float
    #: Run again after ``retry_in`` without using up the attempt (and without an error entry).
    snooze: bool = False
    last_error: str
    errors: Sequence[Mapping[str, Any]]


def error_entry(
    *, attempt: int, at: datetime, error: str, kind: str, details: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """One element of a job's error history, as stored in its ``errors`` JSON array."""
    entry: dict[str, Any] = {"attempt": attempt, "at": at.isoformat(), "error": error, "kind": kind}
    if details:
        entry["details"] = dict(details)
    return entry


def error_record(entry: Mapping[str, Any]) -> ErrorRecord:
    """One stored error-history entry as an :class:`ErrorRecord`."""
    return ErrorRecord(
        attempt=int(entry["attempt"]),
        at=datetime.fromisoformat(str(entry["at"])),
        error=str(entry["error"]),
        kind=str(entry.get("kind", "")),
        details=entry.get("details"),
    )


def progress_entry(
    *, done: float, total: float | None, note: str | None, at: datetime
) -> dict[str, Any]:
    """A job's ``progress`` JSON document."""
    return {"done": done, "total": total, "note": note, "at": at.isoformat()}


def _progress(entry: Mapping[str, Any] | None) -> Progress | None:
    if not entry:
        return None
    return Progress(
        done=entry["done"],
        total=entry.get("total"),
        note=entry.get("note"),
        at=datetime.fromisoformat(str(entry["at"])),
    )


def row_to_job(row: RowMapping) -> Job:
    """A ``sqlqueue_jobs`` row as a frozen :class:`Job`."""
    return Job(
        id=row["id"],
        job_type=row["job_type"],
        queue=row["queue"],
        priority=row["priority"],
        payload=row["payload"],
        status=JobStatus(row["status"]),
        attempts=row["attempts"],
        max_attempts=row["max_attempts"],
        next_run_at=row["next_run_at"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
        result=row["result"],
        progress=_progress(row["progress"]),
        last_error=row["last_error"],
        errors=tuple(error_record(entry) for entry in row["errors"] or ()),
        idempotency_key=row["idempotency_key"],
        group_key=row["group_key"],
        cancel_requested_at=row["cancel_requested_at"],
        locked_by=row["locked_by"],
        lease_expires_at=row["lease_expires_at"],
        requeued_from=row["requeued_from"],
        requeued_as=row["requeued_as"],
        requeued_at=row["requeued_at"],
        requeued_by=row["requeued_by"],
        requeue_reason=row["requeue_reason"],
        discarded_at=row["discarded_at"],
        discarded_by=row["discarded_by"],
        discard_reason=row["discard_reason"],
    )


_NO_ERRORS = ("[]", "null")


def as_utc(value: datetime) -> datetime:
    """An aware UTC datetime from a driver's value (naive values are UTC already)."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def claims_from_rows(
    rows: Iterable[Sequence[Any]],
    *,
    moment: Callable[[Any], datetime] = as_utc,
    document: Callable[[Any], Any] = lambda value: value,
) -> list[ClaimedJob]:
    """A claim's rows, in :data:`CLAIM_COLUMNS` order, as claimed jobs.

    ``moment`` turns a timestamp as the driver returns it into an aware UTC datetime; it runs
    once per distinct value, since a claim's ``started_at`` and ``lease_expires_at`` come from
    one statement clock and jobs enqueued together share ``created_at`` (per value, it was a
    third of the Python time of a 100-job round trip). ``document`` decodes JSON the driver
    returned as text; an empty error history (a first attempt's) is not decoded at all, and a
    JSON ``null`` written by hand reads as an empty one, as it always did."""
    moments: dict[Any, datetime] = {}

    def once(value: Any) -> datetime:
        found = moments.get(value)
        if found is None:
            found = moments[value] = moment(value)
        return found

    claimed = []
    for row in rows:
        (job_id, job_type, queue, priority, payload, attempts, max_attempts, errors,
         created_at, started_at, lease_expires_at) = row  # fmt: skip
        claimed.append(
            ClaimedJob(
                id=job_id,
                job_type=job_type,
                queue=queue,
                priority=priority,
                payload=document(payload),
                attempt=attempts,
                max_attempts=max_attempts,
                errors=() if not errors or errors in _NO_ERRORS else tuple(document(errors) or ()),
                created_at=once(created_at),
                started_at=once(started_at),
                lease_expires_at=once(lease_expires_at),
            )
        )
    return claimed
