"""What the ``sqlqueue`` command reads and prints: durations, moments, tables and jobs as text."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlqueue._batch import BatchStatus
from sqlqueue._job import Job
from sqlqueue._job_action import JobAction
from sqlqueue._operators.moments import parse_duration, parse_moment
from sqlqueue._scrub import shorten

__all__ = [
    "batch_details",
    "job_details",
    "json_text",
    "parse_duration",
    "parse_moment",
    "spoken_duration",
    "table",
]


def json_text(value: Any) -> str:
    """``value`` as indented JSON; datetimes in ISO 8601."""
    return json.dumps(value, indent=2, default=_plain, ensure_ascii=False)


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain text table with left-aligned columns, headers first."""
    cells = [[_cell(value) for value in row] for row in rows]
    widths = [
        max([len(header), *(len(row[i]) for row in cells)]) for i, header in enumerate(headers)
    ]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value)


def spoken_duration(seconds: float) -> str:
    """``seconds`` as a person says it: ``90 seconds``, ``1 hour 30 minutes``, ``7 days``
    (the two largest units; what is below them is left out)."""
    units = (("day", 86_400), ("hour", 3_600), ("minute", 60), ("second", 1))
    left = round(seconds)
    if left < 120 and seconds == left:
        return f"{left} second{'s' if left != 1 else ''}"
    parts: list[str] = []
    for name, size in units:
        count, left = divmod(left, size)
        if count:
            parts.append(f"{count} {name}{'s' if count != 1 else ''}")
        if len(parts) == 2 or (parts and not count):
            break
    return " ".join(parts) or f"{seconds:g} seconds"


def short(text: str | None, width: int = 80) -> str:
    """The first line of ``text``, cut to ``width`` characters."""
    if not text:
        return "-"
    line = text.strip().splitlines()[0] if text.strip() else ""
    return shorten(line, width)


def handling(job: Job) -> str:
    """What a person did with a dead job, if anything."""
    if job.requeued_as is not None:
        return f"requeued as {job.requeued_as} by {job.requeued_by}"
    if job.discarded_at is not None:
        return f"discarded by {job.discarded_by}"
    return "-"


def batch_details(batch: BatchStatus) -> str:
    """One batch and its counts, for ``sqlqueue batch show``."""
    fields: list[tuple[str, Any]] = [
        ("id", batch.id),
        ("done", f"{batch.done} of {batch.total}"),
        *((status.value, count) for status, count in batch.counts.items()),
        ("created", batch.created_at),
        ("finished", batch.finished_at),
        ("callback job", batch.callback_job_id),
    ]
    return "\n".join(f"{name + ':':17} {_cell(value)}" for name, value in fields)


def job_details(job: Job, *, worker: str | None = None, actions: Sequence[JobAction] = ()) -> str:
    """Everything about one job, for ``sqlqueue jobs show`` (``worker``: who runs it; ``actions``:
    what operators did to it besides requeue and discard, which the job records itself)."""
    fields: list[tuple[str, Any]] = [
        ("id", job.id),
        ("type", job.job_type),
        ("queue", job.queue),
        ("status", job.status.value),
        ("priority", job.priority),
        ("attempts", f"{job.attempts} of {job.max_attempts}"),
        ("created", job.created_at),
        ("next run", job.next_run_at),
        ("started", job.started_at),
        ("finished", job.finished_at),
        ("updated", job.updated_at),
        ("idempotency key", job.idempotency_key),
        ("group key", job.group_key),
        ("batch", job.batch_id),
        ("tags", ", ".join(job.tags) or None),
        ("expires", job.expires_at),
        ("locked by", job.locked_by),
        ("worker", worker),
        ("requeued from", job.requeued_from),
        ("requeued as", job.requeued_as),
        ("requeued", _who_when_why(job.requeued_by, job.requeued_at, job.requeue_reason)),
        ("discarded", _who_when_why(job.discarded_by, job.discarded_at, job.discard_reason)),
        ("last error", job.last_error),
    ]
    lines = [f"{name + ':':17} {_cell(value)}" for name, value in fields]
    done = _actions_done(job, actions)
    if done:
        lines.append("actions:")
        lines += ["  " + line for line in done]
    lines.append("payload:")
    lines += ["  " + line for line in json_text(dict(job.payload)).splitlines()]
    if job.result is not None:
        lines.append("result:")
        lines += ["  " + line for line in json_text(job.result).splitlines()]
    if job.errors:
        lines.append("errors:")
        for record in job.errors:
            lines.append(f"  #{record.attempt} {_cell(record.at)} {record.error}")
    return "\n".join(lines)


def _who_when_why(by: str | None, at: datetime | None, reason: str | None) -> str | None:
    if at is None:
        return None
    return f"{_cell(at)} by {by}: {reason}"


def _actions_done(job: Job, actions: Sequence[JobAction]) -> list[str]:
    """Every operator's action on ``job``, oldest first, one line each: when, what, who, why
    (and a reschedule's new run time)."""
    done: list[tuple[datetime, str]] = []
    for action in actions:
        run_at = action.detail.get("run_at")
        extra = f" (run at {run_at})" if run_at else ""
        name = action.action.replace("_", "-")
        done.append((action.at, f"{name} by {action.by}: {action.reason}{extra}"))
    if job.requeued_at is not None:
        what = f" (as job {job.requeued_as})" if job.requeued_as is not None else ""
        done.append((job.requeued_at, f"requeue by {job.requeued_by}: {job.requeue_reason}{what}"))
    if job.discarded_at is not None:
        done.append((job.discarded_at, f"discard by {job.discarded_by}: {job.discard_reason}"))
    return [f"{_cell(at)} {text}" for at, text in sorted(done, key=lambda entry: entry[0])]
