"""The walk over a limited task's keys: which keys with waiting jobs may have room, looked for
in one statement whose cost stays bounded however many keys are at their limit.

The statement is built once per backend and queue set and reused with bound parameters
(building it and its cache key cost more than running it). It also tells whether any job
without a limit is due, so a claim with nothing else to do skips the plain claim's round trip.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Connection,
    Integer,
    Select,
    String,
    and_,
    bindparam,
    case,
    exists,
    func,
    literal_column,
    select,
)
from sqlalchemy.sql.elements import ColumnElement

from sqlqueue._schema import jobs
from sqlqueue._store.statement_cache import cached_statement
from sqlqueue.dialects import Dialect, status_literal

__all__ = [
    "RUNNING",
    "WALK_KEYS",
    "KeyWalk",
    "candidate_keys_query",
    "running_under",
    "walk_keys",
]

#: The most keys one claim looks at (index probes). A claim's cost stays bounded however many
#: keys are at their limit; the next claims look further, round the keys.
WALK_KEYS = 64

_CLAIMABLE = ("queued", "failed")
#: The same as literals: the limited jobs' partial index is declared on exactly this predicate,
#: and a planner cannot prove that a bound parameter matches it.
_CLAIMABLE_LITERALS = [status_literal(status) for status in _CLAIMABLE]
#: ``running`` as a literal too: PostgreSQL then estimates the running jobs from the column's
#: statistics in the plan it keeps for the prepared walk (a generic plan, made once), where a
#: bound status looked like thousands of rows and it planned every execution anew instead.
RUNNING = status_literal("running")


def running_under(
    job_type: str | ColumnElement[str], key: ColumnElement[str]
) -> ColumnElement[bool]:
    """The jobs of ``job_type`` running under ``key``: the predicate of
    ``ix_sqlqueue_jobs_limit_running`` word for word, so the planner proves the index serves."""
    return and_(
        jobs.c.job_type == job_type,
        jobs.c.limit_key == key,
        jobs.c.status == RUNNING,
        jobs.c.limit_key.is_not(None),
    )


#: The walk's parameters, bound at each execution.
_JOB_TYPE: ColumnElement[str] = bindparam("walk_job_type", type_=jobs.c.job_type.type)
_TASK_LIMIT: ColumnElement[int] = bindparam("walk_task_limit", type_=Integer())
_STEPS: ColumnElement[int] = bindparam("walk_steps", type_=Integer())
_AFTER: ColumnElement[str] = bindparam("walk_after", type_=jobs.c.limit_key.type)

#: Where each task's walk over its keys starts next: keys take turns whatever their names sort
#: like (a fairness hint, per process; the limits never depend on it).
_next_start: dict[str, str] = {}


@dataclass(frozen=True, kw_only=True)
class KeyWalk:
    """What one walk found: up to ``wanted`` keys that may have room (in lock order), and
    whether a job without a limit key was due in the claim's queues when it looked."""

    keys: list[str]
    unlimited_due: bool


def walk_keys(
    conn: Connection,
    dialect: Dialect,
    *,
    job_type: str,
    task_limit: int,
    names: Sequence[str],
    queues: Sequence[str],
    job_types: Sequence[str] | None,
    wanted: int,
    now: datetime | None,
) -> KeyWalk:
    """Up to ``wanted`` keys of ``job_type`` with due jobs in ``names`` and room by this
    transaction's view, among the next :data:`WALK_KEYS` keys with waiting jobs past the last
    one looked at (then from the first again). Only a hint: the room is counted again under
    each key's lock. Also whether a job of ``job_types`` without a limit key is due in
    ``queues`` (the plain claim's rows; a hint too: one that comes due later is the next
    claim's)."""
    start = _next_start.get(job_type)
    params: dict[str, Any] = {
        "walk_job_type": job_type,
        "walk_task_limit": task_limit,
        "walk_steps": max(WALK_KEYS, wanted),
    }
    if start is not None:
        params["walk_after"] = start

    def build() -> Select[Any]:
        return _walk_statement(dialect, names, queues, job_types, now, after=start is not None)

    if now is None:
        key = (
            "key_walk",
            type(dialect),
            tuple(names),
            tuple(queues),
            None if job_types is None else tuple(job_types),
            start is not None,
        )
        stmt = cached_statement(key, build)
    else:
        stmt = build()
    taken: list[str] = []
    last: str | None = None
    unlimited_due = False
    for key_, eligible, unlimited in conn.execute(stmt, params).all():
        unlimited_due = bool(unlimited)
        if key_ is None:  # the end of the keys: start from the first next time
            last = None
            break
        last = str(key_)
        if eligible and len(taken) < wanted:
            taken.append(last)
            if len(taken) == wanted:
                break
    if last is None:
        _next_start.pop(job_type, None)
    else:
        _next_start[job_type] = last
    return KeyWalk(keys=sorted(taken), unlimited_due=unlimited_due)


def _walk_statement(
    dialect: Dialect,
    names: Sequence[str],
    queues: Sequence[str],
    job_types: Sequence[str] | None,
    now: datetime | None,
    *,
    after: bool,
) -> Select[Any]:
    unlimited = dialect.due_jobs_exist(queues=queues, job_types=job_types, now=now)
    walk = _walk(
        dialect, _JOB_TYPE, _TASK_LIMIT, names, _STEPS, now, after=_AFTER if after else None
    )
    return walk.add_columns(unlimited.label("unlimited"))


def candidate_keys_query(
    dialect: Dialect,
    job_type: str,
    task_limit: int,
    names: Sequence[str],
    steps: int,
    now: datetime | None = None,
    *,
    after: str | None = None,
) -> Select[Any]:
    """The walk with its values in place (for ``EXPLAIN``): the next ``steps`` keys of
    ``job_type`` with waiting jobs past ``after``, in key order, each with whether it has room
    and due jobs in ``names`` (a NULL key: no more keys)."""
    return _walk(dialect, job_type, task_limit, names, steps, now, after=after)


def _walk(
    dialect: Dialect,
    job_type: str | ColumnElement[str],
    task_limit: int | ColumnElement[int],
    names: Sequence[str],
    steps: int | ColumnElement[int],
    now: datetime | None,
    *,
    after: str | ColumnElement[str] | None,
) -> Select[Any]:
    """A loose index scan: a recursive walk from each waiting key to the next through the
    limited jobs' index, one probe a key, however many jobs wait behind it."""
    waiting = _CLAIMABLE_LITERALS
    anchor = select(
        func.min(jobs.c.limit_key).label("k"), literal_column("1", Integer()).label("n")
    ).where(jobs.c.job_type == job_type, jobs.c.status.in_(waiting), jobs.c.limit_key.is_not(None))
    if after is not None:
        anchor = anchor.where(jobs.c.limit_key > after)
    walk = anchor.cte("sqlqueue_key_walk", recursive=True)
    later = jobs.alias("sqlqueue_later_key")
    following = (
        select(func.min(later.c.limit_key))
        .where(
            later.c.job_type == job_type,
            later.c.status.in_(waiting),
            later.c.limit_key > walk.c.k,
        )
        .scalar_subquery()
    )
    step = select(following.label("k"), (walk.c.n + 1).label("n")).where(
        walk.c.k.is_not(None), walk.c.n < steps
    )
    walk = walk.union_all(step)
    # The key's running jobs, one probe of ``ix_sqlqueue_jobs_limit_running`` a key: a
    # grouping of every running job of the task cost as much as the walk at 1,000 full keys.
    running = (
        select(func.count())
        .where(running_under(job_type, walk.c.k))
        .correlate(walk)
        .scalar_subquery()
    )
    due = (
        exists()
        .where(
            jobs.c.job_type == job_type,
            jobs.c.limit_key == walk.c.k,
            jobs.c.status.in_(waiting),
            jobs.c.queue.in_([bindparam(None, name, type_=String()) for name in names]),
            jobs.c.next_run_at <= dialect.now(now),
        )
        .correlate(walk)
    )
    eligible = case((and_(running < task_limit, due), 1), else_=0)
    return select(walk.c.k, eligible.label("eligible")).order_by(walk.c.n)
