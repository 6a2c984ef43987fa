"""Values that cross the store boundary: claimed jobs, failures, and rows turned into ``Job``."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from sqlalchemy import RowMapping

from sqlqueue._job import ErrorRecord, Job, JobStatus, Progress
from sqlqueue._schema import CLAIM_COLUMNS, ColumnKind, JobColumn
from sqlqueue._secrets import redacted
from sqlqueue._types import as_utc

__all__ = [
    "ClaimedJob",
    "Failure",
    "as_utc",
    "claims_from_rows",
    "error_entry",
    "row_to_job",
]


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
    #: When the job was due (its wait is ``started_at - next_run_at``, both database clock).
    next_run_at: datetime
    created_at: datetime
    #: The batch the job belongs to (a child), or completes (its callback); ``None`` for most.
    batch_id: int | None
    started_at: datetime
    lease_expires_at: datetime
    #: The enqueuer's W3C trace context as JSON text (``None``: it ran in no trace).
    trace_context: str | None = None
    #: This process's ``time.monotonic()`` when the claim's rows came back, the moment
    #: ``started_at`` was read at (give or take a round trip): what the database clock reads
    #: later is ``started_at`` plus the monotonic time since, however long the job was held
    #: before it started (``None``: not known; count from the handler's start).
    claimed_clock: float | None = None

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
    """A ``sqlqueue_jobs`` row as a frozen :class:`Job`; secret fields read as ``"***"``."""
    return Job(
        id=row["id"],
        job_type=row["job_type"],
        queue=row["queue"],
        priority=row["priority"],
        payload=redacted(row["payload"]),
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
        batch_id=row["batch_id"],
        expires_at=row["expires_at"],
        unique_key=row["unique_key"],
    )


_EMPTY_LISTS = ("[]", "null")

#: How each kind of claimed column is read from its row value ``v`` (see ``claims_from_rows``).
_READERS = {
    ColumnKind.PLAIN: "{v}",
    ColumnKind.JSON: "document({v})",
    ColumnKind.JSON_LIST: "() if not {v} or {v} in _EMPTY_LISTS else tuple(document({v}) or ())",
    ColumnKind.TIMESTAMP: "once({v})",
}


def _claim_reader(columns: Sequence[JobColumn]) -> Callable[..., list[ClaimedJob]]:
    """The body of :func:`claims_from_rows` for ``columns``, written out once at import.

    Like ``dataclasses`` and ``namedtuple``, the reader is generated source: each row is
    unpacked by position and each value converted inline, as a hand-written loop would, so
    deriving the columns from ``sqlqueue._schema.CLAIM_COLUMNS`` costs nothing per job.

    Each job is a bare instance whose fields the reader sets with ``object.__setattr__``
    bound once, not the frozen dataclass's ``__init__``, which looks the builtin up again for
    every field: 2.0 µs per job where this takes 1.2 (filling ``__dict__`` at once took 0.5,
    but made every job carry a dict of its own for the garbage collector to walk, and a
    worker with sync handlers spent more than that saved). Every field is set, or the reader
    is not made (:func:`_fill_every_field`)."""
    names = [f"_{column.name}" for column in columns]
    _fill_every_field([column.field for column in columns])
    assignments = "\n".join(
        f"        put(job, {column.field!r}, {_READERS[column.kind].format(v=name)})"
        for column, name in zip(columns, names, strict=True)
    )
    source = f"""\
def read(rows, moment, document, clock):
    moments = {{}}

    def once(value):
        found = moments.get(value)
        if found is None:
            found = moments[value] = moment(value)
        return found

    claimed = []
    append = claimed.append
    for ({", ".join(names)},) in rows:
        job = new(ClaimedJob)
{assignments}
        put(job, "claimed_clock", clock)
        append(job)
    return claimed
"""
    namespace: dict[str, Any] = {
        "ClaimedJob": ClaimedJob,
        "_EMPTY_LISTS": _EMPTY_LISTS,
        "new": object.__new__,
        "put": object.__setattr__,
    }
    exec(compile(source, f"<claim reader of {__name__}>", "exec"), namespace)
    reader: Callable[..., list[ClaimedJob]] = namespace["read"]
    return reader


def _fill_every_field(columns: Sequence[str]) -> None:
    """Refuse to make a reader that would leave a field of :class:`ClaimedJob` unset: its
    ``__init__`` is bypassed, so a field with neither a column nor the claim's clock reading
    would be missing from every claimed job rather than defaulted."""
    expected = {field.name for field in fields(ClaimedJob)}
    filled = {*columns, "claimed_clock"}
    if filled != expected:
        raise RuntimeError(
            f"the claim reader would fill {sorted(filled)} but ClaimedJob has "
            f"{sorted(expected)}: give each field a claimed column (sqlqueue/_schema.py)"
        )


_read_claims = _claim_reader(CLAIM_COLUMNS)


def _as_is(value: Any) -> Any:
    return value


def claims_from_rows(
    rows: Iterable[Sequence[Any]],
    *,
    moment: Callable[[Any], datetime] = as_utc,
    document: Callable[[Any], Any] = _as_is,
) -> list[ClaimedJob]:
    """A claim's rows, in ``sqlqueue._schema.CLAIM_COLUMNS`` order, as claimed jobs.

    ``moment`` turns a timestamp as the driver returns it into an aware UTC datetime; it runs
    once per distinct value, since a claim's ``started_at`` and ``lease_expires_at`` come from
    one statement clock and jobs enqueued together share ``created_at`` (per value, it was a
    third of the Python time of a 100-job round trip). ``document`` decodes JSON the driver
    returned as text; an empty error history (a first attempt's) is not decoded at all, and a
    JSON ``null`` written by hand reads as an empty one, as it always did. Each job carries
    the monotonic time its rows came back (:attr:`ClaimedJob.claimed_clock`)."""
    return _read_claims(rows, moment, document, time.monotonic())
