"""What operators read: :class:`Stats` (counts, ages, recent failures, top errors),
:class:`Health` (the alarms of a job queue), each built from one read of the database,
and :class:`Activity` (jobs finished and failed per minute, for a chart)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Literal

from sqlqueue._job import JobStatus
from sqlqueue._store.readmodel import ActivityRows, PauseRow, StatsRows
from sqlqueue._store.workers import LiveWorker, OverdueType, SeenWorker

__all__ = [
    "Activity",
    "Alarm",
    "ErrorCount",
    "Health",
    "MinuteActivity",
    "QueueStats",
    "Stats",
    "activity_from_rows",
    "check_health",
    "stats_from_rows",
]

_STATUSES = tuple(status.value for status in JobStatus)


def _zeros() -> dict[str, int]:
    return dict.fromkeys(_STATUSES, 0)


@dataclass(frozen=True, kw_only=True)
class QueueStats:
    """One queue: its jobs by status, how long its oldest due job has waited (seconds by the
    database clock; ``None`` when nothing is due), whether an operator paused it — and if
    so when (``paused_at``), who (``paused_by``) and why (``pause_reason``) — and its limit of
    running jobs across all workers (``max_running``; ``None``: no limit)."""

    by_status: Mapping[str, int]
    oldest_queued_age_seconds: float | None
    paused: bool
    paused_at: datetime | None = None
    paused_by: str | None = None
    pause_reason: str | None = None
    max_running: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready values."""
        return {
            "by_status": dict(self.by_status),
            "oldest_queued_age_seconds": self.oldest_queued_age_seconds,
            "paused": self.paused,
            "paused_at": None if self.paused_at is None else self.paused_at.isoformat(),
            "paused_by": self.paused_by,
            "pause_reason": self.pause_reason,
            "max_running": self.max_running,
        }


@dataclass(frozen=True, kw_only=True)
class ErrorCount:
    """A ``last_error`` (its first 200 characters) and how many unhandled failed or dead jobs
    have it."""

    error: str
    count: int


@dataclass(frozen=True, kw_only=True)
class Stats:
    """A snapshot of the whole queue, read by :meth:`sqlqueue.Queue.stats`.

    ``by_status`` holds all seven statuses, zeros included (``waiting``: workflow steps not yet
    released); ``queues`` every queue that has jobs,
    is paused or has a limit; ``job_types`` maps type →
    status → count. ``failed_last_hour``: jobs waiting for a retry whose attempt failed within
    the hour; ``dead_last_hour``: jobs that died within the hour and nobody has requeued or
    discarded. ``top_errors``: the ten most frequent errors
    of unhandled failed and dead jobs. ``taken_at``: the database clock at the read.
    """

    by_status: Mapping[str, int]
    queues: Mapping[str, QueueStats]
    job_types: Mapping[str, Mapping[str, int]]
    failed_last_hour: int
    dead_last_hour: int
    top_errors: tuple[ErrorCount, ...]
    taken_at: datetime

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready values (``sqlqueue stats --json`` prints this)."""
        return {
            "by_status": dict(self.by_status),
            "queues": {name: queue.to_dict() for name, queue in self.queues.items()},
            "job_types": {name: dict(counts) for name, counts in self.job_types.items()},
            "failed_last_hour": self.failed_last_hour,
            "dead_last_hour": self.dead_last_hour,
            "top_errors": [{"error": e.error, "count": e.count} for e in self.top_errors],
            "taken_at": self.taken_at.isoformat(),
        }


def stats_from_rows(rows: StatsRows) -> Stats:
    """Shape the store's rows into :class:`Stats`."""
    by_status = _zeros()
    per_queue: dict[str, dict[str, int]] = {}
    per_type: dict[str, dict[str, int]] = {}
    for status, queue, job_type, count in rows.counts:
        by_status[status] = by_status.get(status, 0) + count
        per_queue.setdefault(queue, _zeros())[status] += count
        per_type.setdefault(job_type, _zeros())[status] += count
    paused = {pause.name: pause for pause in rows.paused}
    names = sorted(set(per_queue) | set(paused) | set(rows.limits))
    return Stats(
        by_status=by_status,
        queues={
            name: replace(
                _queue_stats(
                    per_queue.get(name, _zeros()), rows.oldest_due.get(name), paused.get(name)
                ),
                max_running=rows.limits.get(name),
            )
            for name in names
        },
        job_types={name: per_type[name] for name in sorted(per_type)},
        failed_last_hour=rows.failed_last_hour,
        dead_last_hour=rows.dead_last_hour,
        top_errors=tuple(ErrorCount(error=error, count=count) for error, count in rows.top_errors),
        taken_at=rows.taken_at,
    )


def _queue_stats(
    by_status: Mapping[str, int], oldest_due: float | None, pause: PauseRow | None
) -> QueueStats:
    if pause is None:
        return QueueStats(by_status=by_status, oldest_queued_age_seconds=oldest_due, paused=False)
    return QueueStats(
        by_status=by_status,
        oldest_queued_age_seconds=oldest_due,
        paused=True,
        paused_at=pause.paused_at,
        paused_by=pause.paused_by,
        pause_reason=pause.reason,
    )


AlarmName = Literal["dead_jobs", "same_error", "queued_age", "unknown_type", "no_workers"]


@dataclass(frozen=True, kw_only=True)
class Alarm:
    """One signal that something is wrong: which alarm, what it concerns (a queue, an error,
    the job types no live worker knows), the figure measured and the threshold it passed, and
    a sentence for a person."""

    name: AlarmName
    figure: float
    threshold: float
    message: str
    queue: str | None = None
    error: str | None = None
    job_types: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready values."""
        return {
            "name": self.name,
            "figure": self.figure,
            "threshold": self.threshold,
            "message": self.message,
            "queue": self.queue,
            "error": self.error,
            "job_types": list(self.job_types),
        }


@dataclass(frozen=True, kw_only=True)
class Health:
    """The alarms :meth:`sqlqueue.Queue.health` found (none: ``ok``), with the stats read."""

    alarms: tuple[Alarm, ...]
    stats: Stats = field(repr=False)

    @property
    def ok(self) -> bool:
        """No alarm is raised."""
        return not self.alarms

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready values (``sqlqueue health --json`` prints this)."""
        return {"ok": self.ok, "alarms": [alarm.to_dict() for alarm in self.alarms]}


def check_health(
    stats: Stats,
    *,
    max_queued_age: float,
    max_dead_last_hour: int,
    max_same_error: int,
    live_workers: Sequence[LiveWorker] = (),
    overdue: Sequence[OverdueType] = (),
    max_unserved: float | None = None,
    seen_workers: Sequence[SeenWorker] = (),
) -> Health:
    """The alarms, each raised when its figure is over its threshold: dead jobs growing fast,
    the same error across many jobs, due jobs nobody picks up (paused queues are waiting on
    purpose and raise none) — and among those, jobs of types that no live worker serving their
    queue has a task for (``overdue``: the late queues' jobs due longer than the threshold, by
    type) — and queues with due jobs that no live worker has served for over ``max_unserved``
    seconds (``seen_workers``: every worker's row, live or gone)."""
    alarms: list[Alarm] = []
    if stats.dead_last_hour > max_dead_last_hour:
        alarms.append(
            Alarm(
                name="dead_jobs",
                figure=stats.dead_last_hour,
                threshold=max_dead_last_hour,
                message=f"{stats.dead_last_hour} jobs died in the last hour "
                f"(more than {max_dead_last_hour}) and nobody has requeued or discarded them",
            )
        )
    for top in stats.top_errors:
        if top.count > max_same_error:
            alarms.append(
                Alarm(
                    name="same_error",
                    figure=top.count,
                    threshold=max_same_error,
                    error=top.error,
                    message=f"{top.count} failed or dead jobs share the error {top.error!r} "
                    f"(more than {max_same_error})",
                )
            )
    for name, queue in stats.queues.items():
        age = queue.oldest_queued_age_seconds
        if age is not None and age > max_queued_age and not queue.paused:
            late = [row for row in overdue if row.queue == name]
            alarms += _late_queue(name, age, max_queued_age, late, live_workers)
    if max_unserved is not None:
        alarms += _unserved_queues(stats, max_unserved, seen_workers)
    return Health(alarms=tuple(alarms), stats=stats)


def _unserved_queues(
    stats: Stats, threshold: float, seen_workers: Sequence[SeenWorker]
) -> list[Alarm]:
    """``no_workers`` for each queue (not paused) with due jobs that no live worker serves,
    and none has for more than ``threshold`` seconds: the time since its oldest due job became
    due, or since a worker serving it was last seen if that is later (a worker that stopped
    cleanly left no row, so its queue counts from the oldest due job)."""
    alarms: list[Alarm] = []
    for name, queue in stats.queues.items():
        age = queue.oldest_queued_age_seconds
        if age is None or queue.paused:
            continue
        serving = [worker for worker in seen_workers if name in worker.queues]
        if any(worker.alive for worker in serving):
            continue
        unserved = min([age, *(worker.seen_seconds_ago for worker in serving)])
        if unserved <= threshold:
            continue
        since = "a worker serving it was last seen" if unserved < age else "its oldest job is due"
        alarms.append(
            Alarm(
                name="no_workers",
                figure=unserved,
                threshold=threshold,
                queue=name,
                message=f"queue {name!r}: jobs are due and no live worker serves it, for "
                f"{unserved:.0f} s since {since} (more than {threshold:g} s); start a worker "
                f"for it (sqlqueue worker APP --queues {name})",
            )
        )
    return alarms


def _late_queue(
    name: str,
    age: float,
    threshold: float,
    late: Sequence[OverdueType],
    live_workers: Sequence[LiveWorker],
) -> list[Alarm]:
    """A queue whose oldest due job waited over ``threshold``: ``unknown_type`` for its late
    jobs of types that no live worker serving it knows, ``queued_age`` for the rest (all of
    them when no live worker serves it: then nobody may be running workers at all)."""
    serving = [worker for worker in live_workers if name in worker.queues]
    known: set[str] = set()
    for worker in serving:
        if worker.job_types is None:  # it claims every type
            serving = []
            break
        known |= worker.job_types
    unknown = [row for row in late if row.job_type not in known] if serving else []
    alarms: list[Alarm] = []
    if unknown:
        types = ", ".join(
            f"{row.job_type!r} ({row.count} due job{'s' if row.count != 1 else ''}, "
            f"oldest {row.age_seconds:.0f} s)"
            for row in unknown
        )
        alarms.append(
            Alarm(
                name="unknown_type",
                figure=max(row.age_seconds for row in unknown),
                threshold=threshold,
                queue=name,
                job_types=tuple(row.job_type for row in unknown),
                message=f"queue {name!r}: no live worker has a task for {types}, waiting "
                f"more than {threshold:g} s; start a worker that registers these tasks",
            )
        )
    runnable = [row.age_seconds for row in late if row not in unknown]
    if runnable or not unknown:
        figure = max(runnable) if runnable else age
        alarms.append(
            Alarm(
                name="queued_age",
                figure=figure,
                threshold=threshold,
                queue=name,
                message=f"queue {name!r}: the oldest due job has waited {figure:.0f} s "
                f"(more than {threshold:g} s); is any worker serving it?",
            )
        )
    return alarms


@dataclass(frozen=True, kw_only=True)
class MinuteActivity:
    """One minute: from ``start`` (database clock), how many jobs ``succeeded``, how many
    ``failed`` (their latest attempt failed in it and they wait for a retry) and how many
    died (``dead``)."""

    start: datetime
    succeeded: int
    failed: int
    dead: int

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready values."""
        return {
            "start": self.start.isoformat(),
            "succeeded": self.succeeded,
            "failed": self.failed,
            "dead": self.dead,
        }


@dataclass(frozen=True, kw_only=True)
class Activity:
    """Jobs finished and failed per minute over the last minutes, oldest minute first, every
    minute present (zeros included); read by :meth:`sqlqueue.Queue.activity`."""

    minutes: tuple[MinuteActivity, ...]
    taken_at: datetime

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready values."""
        return {
            "minutes": [minute.to_dict() for minute in self.minutes],
            "taken_at": self.taken_at.isoformat(),
        }


def activity_from_rows(rows: ActivityRows, minutes: int) -> Activity:
    """Shape the store's ``(status, minutes ago, count)`` rows into ``minutes`` buckets; a job
    stamped a moment after the read's clock counts in the latest minute."""
    counts = [dict.fromkeys(("succeeded", "failed", "dead"), 0) for _ in range(minutes)]
    for status, ago, count in rows.counts:
        if ago < minutes and status in counts[0]:
            counts[minutes - 1 - max(ago, 0)][status] += count
    end = rows.taken_at
    return Activity(
        minutes=tuple(
            MinuteActivity(start=end - timedelta(minutes=minutes - index), **bucket)
            for index, bucket in enumerate(counts)
        ),
        taken_at=end,
    )
