"""The operators' read model: the queries that stats, search, health, the CLI, the web page and
the metrics exporter share — written once, here.

Counting live work reads ``ix_sqlqueue_jobs_status`` alone; finished jobs, a rollup plus the
index of the recently finished (:mod:`sqlqueue._store.counts`); the top errors, a rollup too
(:mod:`sqlqueue._store.error_counts`); "the oldest due job" and
"failed lately" read only claimable rows; "dead lately" reads ``ix_sqlqueue_jobs_finished``.
None of them scans the finished history.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime

from sqlalchemy import Connection, func, or_, select, union_all

from sqlqueue._job import Job
from sqlqueue._schema import ERROR_GROUP_CHARS, jobs, queues
from sqlqueue._store.counts import read_finished_counts
from sqlqueue._store.error_counts import read_top_errors
from sqlqueue._store.filters import JobFilter, unhandled_dead
from sqlqueue._store.readable import readable
from sqlqueue._store.rows import row_to_job
from sqlqueue._store.tags import read_tags
from sqlqueue.dialects import Dialect

__all__ = [
    "ERROR_GROUP_CHARS",
    "ActivityRows",
    "PauseRow",
    "StatsRows",
    "count_jobs",
    "find_jobs",
    "paused_queues",
    "read_activity",
    "read_pauses",
    "read_stats",
]

#: The live work, counted from a short range of ``ix_sqlqueue_jobs_status`` whatever the
#: history's size (finished jobs: see :mod:`sqlqueue._store.counts`).
UNFINISHED = ("queued", "running", "failed", "waiting")


@dataclass(frozen=True, kw_only=True)
class PauseRow:
    """A queue paused now: since when, by whom and why (as the operator gave them)."""

    name: str
    paused_at: datetime
    paused_by: str | None
    reason: str | None


@dataclass(frozen=True, kw_only=True)
class StatsRows:
    """What :func:`read_stats` read, as plain rows for the public ``Stats`` to shape."""

    counts: list[tuple[str, str, str, int]]
    oldest_due: dict[str, float]
    paused: list[PauseRow]
    #: Each queue's limit of running jobs, where it has one.
    limits: dict[str, int]
    failed_last_hour: int
    dead_last_hour: int
    top_errors: list[tuple[str, int]]
    taken_at: datetime


def read_stats(conn: Connection, dialect: Dialect, *, now: datetime | None = None) -> StatsRows:
    """Counts by (status, queue, job type), each queue's oldest due age, recent failures and
    deaths, the most frequent errors of unhandled failures, and the paused queues."""
    current = dialect.now(now)
    hour_ago = dialect.now_plus(-3600.0, now)
    taken_at: datetime = conn.execute(select(current)).scalar_one()
    count = func.count().label("n")
    live = conn.execute(
        select(jobs.c.status, jobs.c.queue, jobs.c.job_type, count)
        .where(jobs.c.status.in_(UNFINISHED))
        .group_by(jobs.c.status, jobs.c.queue, jobs.c.job_type)
    )
    counts = [(row.status, row.queue, row.job_type, int(row.n)) for row in live]
    counts += read_finished_counts(conn, dialect)
    age = dialect.seconds_between(current, func.min(jobs.c.next_run_at)).label("age")
    oldest = conn.execute(
        select(jobs.c.queue, age)
        .where(jobs.c.status.in_(("queued", "failed")), jobs.c.next_run_at <= current)
        .group_by(jobs.c.queue)
    ).all()
    failed = conn.execute(
        select(func.count()).where(jobs.c.status == "failed", jobs.c.updated_at >= hour_ago)
    ).scalar_one()
    dead = conn.execute(
        select(func.count()).where(*unhandled_dead(), jobs.c.finished_at >= hour_ago)
    ).scalar_one()
    return StatsRows(
        counts=counts,
        oldest_due={row.queue: max(0.0, float(row.age)) for row in oldest},
        paused=read_pauses(conn),
        limits=queue_controls(conn)[1],
        failed_last_hour=int(failed),
        dead_last_hour=int(dead),
        top_errors=read_top_errors(conn, dialect, limit=10),
        taken_at=taken_at,
    )


@dataclass(frozen=True, kw_only=True)
class ActivityRows:
    """What :func:`read_activity` read: ``(status, minutes ago, count)`` rows and the clock."""

    counts: list[tuple[str, int, int]]
    taken_at: datetime


def read_activity(
    conn: Connection, dialect: Dialect, *, minutes: int, now: datetime | None = None
) -> ActivityRows:
    """How many jobs succeeded, died, or failed and wait for a retry, in each of the last
    ``minutes`` minutes (0: the minute that ends now): finished jobs by ``finished_at``
    (``ix_sqlqueue_jobs_finished``), waiting ones by their latest failure, from the few
    claimable rows — neither scans the history."""
    current = dialect.now(now)
    start = dialect.now_plus(-60.0 * minutes, now)
    taken_at: datetime = conn.execute(select(current)).scalar_one()
    finished = select(
        jobs.c.status, dialect.minutes_between(current, jobs.c.finished_at).label("minute")
    ).where(jobs.c.status.in_(("succeeded", "dead")), jobs.c.finished_at > start)
    finished = readable(finished, dialect)  # a succeeded job may have moved already
    failing = select(
        jobs.c.status, dialect.minutes_between(current, jobs.c.updated_at).label("minute")
    ).where(jobs.c.status == "failed", jobs.c.updated_at > start)
    both = union_all(finished, failing).subquery()
    rows = conn.execute(
        select(both.c.status, both.c.minute, func.count().label("n")).group_by(
            both.c.status, both.c.minute
        )
    )
    counts = [(str(row.status), int(row.minute), int(row.n)) for row in rows]
    return ActivityRows(counts=counts, taken_at=taken_at)


def find_jobs(
    conn: Connection,
    dialect: Dialect,
    job_filter: JobFilter,
    *,
    limit: int,
    before_id: int | None,
) -> list[Job]:
    """Jobs matching ``job_filter``, newest first, at most ``limit``, ids below ``before_id``,
    each with its tags (one more indexed read for the page, not one per job); moved jobs too
    (:mod:`sqlqueue._store.readable`)."""
    query = select(jobs).where(*job_filter.clauses()).order_by(jobs.c.id.desc()).limit(limit)
    if before_id is not None:
        query = query.where(jobs.c.id < before_id)
    query = readable(query, dialect)
    found = [row_to_job(row) for row in conn.execute(query).mappings()]
    tags = read_tags(conn, [job.id for job in found]) if found else {}
    return [replace(job, tags=tags[job.id]) if job.id in tags else job for job in found]


def count_jobs(conn: Connection, dialect: Dialect, job_filter: JobFilter) -> int:
    """How many jobs match ``job_filter`` (moved ones too)."""
    query = readable(select(func.count()).select_from(jobs).where(*job_filter.clauses()), dialect)
    return int(conn.execute(query).scalar_one())


def paused_queues(conn: Connection) -> list[str]:
    """The names of the queues paused now."""
    query = select(queues.c.name).where(queues.c.paused_at.is_not(None)).order_by(queues.c.name)
    return list(conn.execute(query).scalars())


def queue_controls(conn: Connection) -> tuple[list[str], dict[str, int]]:
    """What workers obey of the queues' operator settings, in one read: the paused queues,
    and the limit of running jobs of each queue that has one."""
    query = select(queues.c.name, queues.c.paused_at, queues.c.max_running).where(
        or_(queues.c.paused_at.is_not(None), queues.c.max_running.is_not(None))
    )
    paused, limits = [], {}
    for name, paused_at, max_running in conn.execute(query).all():
        if paused_at is not None:
            paused.append(name)
        if max_running is not None:
            limits[name] = int(max_running)
    return sorted(paused), limits


def read_pauses(conn: Connection) -> list[PauseRow]:
    """The queues paused now, with who paused them, when and why, by name."""
    query = (
        select(queues.c.name, queues.c.paused_at, queues.c.paused_by, queues.c.pause_reason)
        .where(queues.c.paused_at.is_not(None))
        .order_by(queues.c.name)
    )
    return [
        PauseRow(
            name=row.name, paused_at=row.paused_at, paused_by=row.paused_by, reason=row.pause_reason
        )
        for row in conn.execute(query)
    ]
