"""The claim and the fence, as a dialect builds them: lease due jobs in one statement, and the
conditions every transition out of ``running`` is fenced by (the row still running under the
same worker and attempt). Backends override the statement; the store runs it."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Boolean,
    DateTime,
    Float,
    Integer,
    Select,
    String,
    Text,
    Update,
    bindparam,
    case,
    cast,
    exists,
    func,
    literal_column,
    null,
    or_,
    select,
    tuple_,
    type_coerce,
    update,
)
from sqlalchemy.sql.elements import ColumnElement

from sqlqueue._schema import CLAIM_COLUMNS, ColumnKind, jobs
from sqlqueue._types import as_utc
from sqlqueue.dialects._clock import Clock

__all__ = [
    "CLAIM_JSON",
    "CLAIM_RETURNING",
    "CLAIM_TIMESTAMPS",
    "Claiming",
    "status_literal",
]

#: Columns a claim hands to the worker, in ``sqlqueue._schema.CLAIM_COLUMNS`` order.
CLAIM_RETURNING = tuple(jobs.c[column.name] for column in CLAIM_COLUMNS)

#: The columns of :data:`CLAIM_RETURNING` that hold JSON, and those that are timestamps.
CLAIM_JSON = frozenset(
    c.name for c in CLAIM_COLUMNS if c.kind in (ColumnKind.JSON, ColumnKind.JSON_LIST)
)
CLAIM_TIMESTAMPS = frozenset(c.name for c in CLAIM_COLUMNS if c.kind is ColumnKind.TIMESTAMP)


#: The claim statement's parameters, bound at each execution (see ``Dialect.claim_statement``).
_CLAIM_LIMIT: ColumnElement[int] = bindparam("claim_limit", type_=Integer())
_WORKER_ID: ColumnElement[str] = bindparam("worker_id", type_=String())
_LEASE_SECONDS: ColumnElement[float] = bindparam("lease_seconds", type_=Float())
#: True when the jobs are claimed ahead of a free slot: their ``started_at`` stays NULL until
#: the worker records their start, so a reaper can tell a job that never ran from one that did.
_CLAIM_AHEAD: ColumnElement[bool] = bindparam("claim_ahead", type_=Boolean())
_FLOOR_PRIORITY: ColumnElement[int] = bindparam("floor_priority", type_=Integer())
_FLOOR_DUE: ColumnElement[datetime] = bindparam("floor_due", type_=jobs.c.next_run_at.type)
#: A limited claim's task and key (see ``sqlqueue/_store/limited_claim.py``).
_LIMIT_JOB_TYPE: ColumnElement[str] = bindparam("claim_limit_job_type", type_=jobs.c.job_type.type)
_LIMIT_KEY: ColumnElement[str] = bindparam("claim_limit_key", type_=jobs.c.limit_key.type)


def status_literal(name: str) -> ColumnElement[str]:
    """A job status written into the SQL as a literal, wherever a statement compares or writes
    one: partial indexes are declared on status predicates, and a planner cannot prove a bound
    parameter matches one (SQLite then sorted every due row on each claim: ~70 ms at a 100k
    backlog instead of ~3 ms). SQLite also prepares a statement again at every run where a
    bound value meets a partial index's predicate, and the driver binds at every run: the
    claim's ``SET status = ?`` and its group check's ``status = ?`` made each claim a fresh
    compile of the whole statement, as the fence's ``status = ?`` and the new status did for
    every completion, failure and heartbeat. Literals also spare each execution the
    re-rendering an expanding or ``literal_execute`` parameter costs. Only constants: what
    varies per job stays bound."""
    assert name.isidentifier()
    return literal_column(f"'{name}'", String())


def _statuses(*names: str) -> list[ColumnElement[str]]:
    """:func:`status_literal` of each of ``names``, for ``status IN (…)``."""
    return [status_literal(name) for name in names]


def _one_of(column: ColumnElement[str], values: Sequence[str]) -> ColumnElement[bool]:
    """``column IN (?, ?, …)`` with one plain bound parameter per value: the statement is
    built once per set of values, so nothing is re-rendered at execution."""
    return column.in_([bindparam(None, value, type_=String()) for value in values])


def _earlier_in_group() -> ColumnElement[bool]:
    """Another unfinished job of the same group is running or was enqueued earlier: per-key
    ordering lets only the oldest unfinished job of a group run, and only when none runs."""
    other = jobs.alias("sqlqueue_same_group")
    return exists().where(
        other.c.group_key == jobs.c.group_key,
        other.c.status.in_(_statuses("queued", "failed", "running")),
        or_(other.c.status == status_literal("running"), other.c.id < jobs.c.id),
    )


def _claimed_value(column: ColumnElement[Any]) -> ColumnElement[Any]:
    """What a claim returns for ``column``: a job claimed ahead has no ``started_at`` yet, and
    the claim's time (``updated_at``) stands in for it."""
    if column.name == "started_at":
        return func.coalesce(column, jobs.c.updated_at).label(column.name)
    return column


class Claiming(Clock):
    """The claim statement, what it returns, and the lease fence (portable forms)."""

    def claim_statement(
        self,
        *,
        queues: Sequence[str],
        job_types: Sequence[str] | None,
        lease_seconds: float,
        now: datetime | None,
        floor: bool = False,
        limited: bool = False,
    ) -> Update:
        """Lease up to ``:claim_limit`` due jobs to ``:worker_id`` in one statement and return
        them (portable form). The parameters are bound at execution, so one statement serves
        every claim of a worker; ``lease_seconds`` is bound as ``:lease_seconds`` too, except
        with an injected ``now``, whose lease end is a constant. ``floor``: only jobs at or
        after ``(:floor_priority, :floor_due)`` in claim order (see ``_store/claim_floor.py``).
        ``limited``: only the jobs of ``:claim_limit_job_type`` under ``:claim_limit_key`` (a
        claim that holds the key's lock and counted its room); else only jobs with no limit key.
        ``:claim_ahead`` leaves the jobs' ``started_at`` NULL: held for a slot, not started."""
        due = self._due_jobs(
            queues=queues,
            job_types=job_types,
            limit=_CLAIM_LIMIT,
            now=now,
            floor=floor,
            limited=limited,
        )
        return self._lease(due.scalar_subquery(), lease_seconds, now, in_subquery=True)

    def due_jobs_exist(
        self, *, queues: Sequence[str], job_types: Sequence[str] | None, now: datetime | None
    ) -> ColumnElement[bool]:
        """Whether :meth:`claim_statement` (not ``limited``) would find a due job in ``queues``
        now, as a condition: a claim whose other parts found nothing skips that statement's
        round trip when it is false (portable form)."""
        due = self._due_jobs(
            queues=queues, job_types=job_types, limit=literal_column("1", Integer()), now=now
        )
        return exists(due.order_by(None).limit(None))

    def floor_probe_statement(
        self, *, queues: Sequence[str], job_types: Sequence[str] | None
    ) -> Select[Any]:
        """The claim order key ``(priority, next_run_at)`` of the first job a claim without a
        floor would take (not ``limited``) that sorts before ``(:floor_priority, :floor_due)``,
        or no row: a worker's floor probe (``_store/floor_probe.py``). A plain read that locks
        nothing, so a job another worker is claiming right now counts as found."""
        due = self._due_jobs(
            queues=queues, job_types=job_types, limit=literal_column("1", Integer()), now=None
        )
        return due.with_only_columns(jobs.c.priority, jobs.c.next_run_at).where(
            tuple_(jobs.c.priority, jobs.c.next_run_at) < tuple_(_FLOOR_PRIORITY, _FLOOR_DUE)
        )

    def _due_jobs(
        self,
        *,
        queues: Sequence[str],
        job_types: Sequence[str] | None,
        limit: ColumnElement[int],
        now: datetime | None,
        floor: bool = False,
        limited: bool = False,
    ) -> Select[Any]:
        query = (
            select(jobs.c.id)
            .where(
                jobs.c.status.in_(_statuses("queued", "failed")),  # the claim index's predicate
                _one_of(jobs.c.queue, queues),
                jobs.c.next_run_at <= self.now(now),
            )
            .order_by(jobs.c.priority, jobs.c.next_run_at, jobs.c.id)
            .limit(limit)
        )
        if job_types is not None:
            query = query.where(_one_of(jobs.c.job_type, job_types))
        if floor:
            # A row comparison on the claim index's columns after the queue: the index scan
            # starts there instead of at the dead versions before it.
            query = query.where(
                tuple_(jobs.c.priority, jobs.c.next_run_at) >= tuple_(_FLOOR_PRIORITY, _FLOOR_DUE)
            )
        if limited:
            query = query.where(jobs.c.job_type == _LIMIT_JOB_TYPE, jobs.c.limit_key == _LIMIT_KEY)
        else:
            query = query.where(jobs.c.limit_key.is_(None))
        # A job past its expiry is never claimed (the upkeep cancels it): checked on the rows
        # the index scan visits, not in the index, since almost every job has none.
        return query.where(
            or_(jobs.c.expires_at.is_(None), jobs.c.expires_at > self.now(now)),
            or_(jobs.c.group_key.is_(None), ~_earlier_in_group()),
        )

    def _lease(
        self, chosen: Any, lease_seconds: float, now: datetime | None, *, in_subquery: bool
    ) -> Update:
        current = self.now(now)
        lease = self.now_plus(_LEASE_SECONDS if now is None else lease_seconds, now)
        condition = jobs.c.id.in_(chosen) if in_subquery else jobs.c.id == chosen
        return (
            update(jobs)
            .where(condition)
            .values(
                status=status_literal("running"),
                attempts=jobs.c.attempts + 1,
                locked_by=_WORKER_ID,
                started_at=case((_CLAIM_AHEAD, null()), else_=current),
                updated_at=current,
                lease_expires_at=lease,
            )
            .returning(*self.claim_returning())
        )

    def claim_returning(self) -> tuple[ColumnElement[Any], ...]:
        """What a claim returns: the columns of :data:`CLAIM_RETURNING`, in that order, for the
        store to read: JSON as text (decoded from ``str``, where drivers decode bytes, an empty
        error history not at all), timestamps as the driver reads them (made UTC by
        :meth:`claim_moment` once per distinct value, where the column type would convert
        each)."""
        return tuple(self._claim_column(_claimed_value(column)) for column in CLAIM_RETURNING)

    def _claim_column(self, column: ColumnElement[Any]) -> ColumnElement[Any]:
        if column.name in CLAIM_JSON:
            return cast(column, Text()).label(column.name)
        if column.name in CLAIM_TIMESTAMPS:
            return type_coerce(column, DateTime(timezone=True)).label(column.name)
        return column

    def claim_moment(self, value: Any) -> datetime:
        """A timestamp of :meth:`claim_returning` as the driver returns it, as an aware UTC
        datetime (the store calls it once per distinct value of a claim)."""
        return as_utc(value)

    def holds_lease(
        self, worker_id: Any, fences: Sequence[tuple[int, int]] | None = None
    ) -> list[ColumnElement[bool]]:
        """WHERE conditions of a fenced transition: the row is one of ``fences`` (``(id,
        attempt)`` pairs) and still ``running`` under ``worker_id``'s lease (a value or a bound
        parameter). ``fences=None``: bound at execution, from :meth:`fence_parameters`."""
        if fences is None:
            ids: Any = bindparam("fence_ids", expanding=True)
            pairs: Any = bindparam("fences", expanding=True)
        else:
            ids, pairs = [job_id for job_id, _ in fences], list(fences)
        return [
            jobs.c.status == status_literal("running"),
            jobs.c.locked_by == worker_id,
            jobs.c.id.in_(ids),  # the primary key: index lookups
            tuple_(jobs.c.id, jobs.c.attempts).in_(pairs),
        ]

    def fence_parameters(self, fences: Sequence[tuple[int, int]]) -> dict[str, Any]:
        """The execution parameters of ``holds_lease(…, fences=None)`` for ``fences``."""
        return {"fence_ids": [job_id for job_id, _ in fences], "fences": list(fences)}
