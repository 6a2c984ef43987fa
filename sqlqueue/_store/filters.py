"""Which jobs an operator means: one filter, turned into WHERE conditions once, for listing
jobs and for acting on dead ones alike."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import String, func, literal
from sqlalchemy.sql.elements import ColumnElement

from sqlqueue._schema import jobs
from sqlqueue._store.tags import tagged

__all__ = ["JobFilter", "exactly", "unhandled_dead"]


@dataclass(frozen=True, kw_only=True)
class JobFilter:
    """Which jobs an operator means: every given field must match (``None`` matches all).

    ``since``/``until`` bound ``updated_at``, the time of the job's latest change (enqueued,
    failed, finished, requeued or discarded). ``unhandled`` keeps only dead jobs that nobody has
    requeued or discarded yet. ``statuses``: any of these (with ``status``, both must hold).
    """

    status: str | None = None
    job_type: str | None = None
    queue: str | None = None
    error_contains: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    job_ids: Sequence[int] | None = None
    group_key: str | None = None
    unhandled: bool = False
    statuses: Sequence[str] | None = None
    batch_id: int | None = None
    idempotency_key: str | None = None
    #: Jobs with this tag (``sqlqueue_job_tags``).
    tag: str | None = None

    def clauses(self) -> list[ColumnElement[bool]]:
        """The filter as WHERE conditions on ``sqlqueue_jobs``, values bound."""
        where: list[ColumnElement[bool]] = []
        if self.status is not None:
            where.append(jobs.c.status == self.status)
        if self.job_type is not None:
            where.extend(exactly(jobs.c.job_type, self.job_type))
        if self.queue is not None:
            where.extend(exactly(jobs.c.queue, self.queue))
        if self.error_contains:
            where.append(jobs.c.last_error.contains(self.error_contains, autoescape=True))
        if self.since is not None:
            where.append(jobs.c.updated_at >= self.since)
        if self.until is not None:
            where.append(jobs.c.updated_at < self.until)
        if self.group_key is not None:
            where.extend(exactly(jobs.c.group_key, self.group_key))
        if self.job_ids is not None:
            where.append(jobs.c.id.in_(list(self.job_ids)))
        if self.unhandled:
            where.extend(unhandled_dead())
        if self.statuses is not None:
            where.append(jobs.c.status.in_(list(self.statuses)))
        if self.batch_id is not None:
            where.append(jobs.c.batch_id == self.batch_id)
        if self.idempotency_key is not None:
            where.append(jobs.c.idempotency_key == self.idempotency_key)
        if self.tag is not None:
            where.append(tagged(self.tag))
        return where


def exactly(column: ColumnElement[str | None], value: str) -> list[ColumnElement[bool]]:
    """``column`` equal to ``value``, trailing spaces included: MariaDB/MySQL collations pad
    the shorter side with spaces when they compare, so ``=`` alone finds ``"mail"`` for
    ``"mail "``. Equal lengths as well make the comparison exact on every backend (the
    equality still uses the index)."""
    return [column == value, func.length(column) == func.length(literal(value, String()))]


def unhandled_dead() -> list[ColumnElement[bool]]:
    """Dead jobs still waiting for a person: neither requeued nor discarded."""
    return [
        jobs.c.status == "dead",
        jobs.c.requeued_as.is_(None),
        jobs.c.discarded_at.is_(None),
    ]
