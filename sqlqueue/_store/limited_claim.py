"""Claims under concurrency limits: a queue's ``max_running`` and a task's ``Concurrency``.

Exact under concurrent claimers on every backend, and nothing to give back: a claim takes the
lock of each limit it fills (the queue's row in ``sqlqueue_queues``, the (task, key) row in
``sqlqueue_limit_keys``; SQLite's write lock serialises claims already), only then counts the
jobs running under it (a new statement, so PostgreSQL's READ COMMITTED and MariaDB's sessions
see every claim committed before the lock was granted), and leases at most the room left. A
slot frees itself when its job stops being ``running`` — an outcome, a release, a cancel, or
the reaper once a dead worker's lease expired — so no path can leak one.

Locks are taken in one order (queues by name, then keys by task and key), and a claimer that
holds them waits for nothing else (the claim itself skips locked job rows): no deadlocks.
Jobs of unlimited tasks in unlimited queues take the plain claim, with no extra statement.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Connection,
    Integer,
    Select,
    String,
    and_,
    case,
    exists,
    func,
    literal_column,
    select,
)

from sqlqueue._schema import jobs, limit_keys, queues
from sqlqueue._store import claim as plain
from sqlqueue._store.claim_floor import ClaimFloors
from sqlqueue._store.rows import ClaimedJob
from sqlqueue.dialects import Dialect

__all__ = ["ClaimLimits", "candidate_keys_query", "claim_within_limits"]

_CLAIMABLE = ("queued", "failed")
#: The same as literals: the limited jobs' partial index is declared on exactly this predicate,
#: and a planner cannot prove that a bound parameter matches it.
_CLAIMABLE_LITERALS = [literal_column(f"'{status}'", String()) for status in _CLAIMABLE]


@dataclass(frozen=True, kw_only=True)
class ClaimLimits:
    """The limits a worker's claims obey: its tasks' ``Concurrency`` limits by task name (from
    their declarations), and queues' ``max_running`` (read from the database every poll)."""

    tasks: Mapping[str, int] = field(default_factory=dict)
    queues: Mapping[str, int] = field(default_factory=dict)

    def apply_to(self, names: Sequence[str], job_types: Sequence[str] | None) -> bool:
        """Whether a claim from queues ``names`` of ``job_types`` meets any of these limits."""
        if any(name in self.queues for name in names):
            return True
        if job_types is None:
            return bool(self.tasks)
        return any(job_type in self.tasks for job_type in job_types)


def claim_within_limits(
    conn: Connection,
    dialect: Dialect,
    limits: ClaimLimits,
    *,
    queues: Sequence[str],
    job_types: Sequence[str] | None,
    limit: int,
    worker_id: str,
    lease_seconds: float,
    ahead: bool = False,
    now: datetime | None = None,
    floors: ClaimFloors | None = None,
) -> list[ClaimedJob]:
    """Lease up to ``limit`` due jobs like :func:`claim.claim`, none beyond a limit: the
    limited tasks' jobs first (their limits bound them, so they cannot crowd the rest out),
    key by key, then the unlimited jobs."""
    room = _queue_room(conn, dialect, limits, queues)
    claimed: list[ClaimedJob] = []

    def lease(names: Sequence[str], n: int, limited: tuple[str, str] | None) -> None:
        jobs_ = plain.claim(
            conn,
            dialect,
            queues=names,
            job_types=job_types,
            limit=n,
            worker_id=worker_id,
            lease_seconds=lease_seconds,
            ahead=ahead,
            now=now,
            floors=floors if limited is None else None,
            limited=limited,
        )
        for job in jobs_:
            if job.queue in room:
                room[job.queue] -= 1
        claimed.extend(jobs_)

    for job_type, task_limit in sorted(limits.tasks.items()):
        if job_types is not None and job_type not in job_types:
            continue
        names = _open(queues, room)
        wanted = limit - len(claimed)
        if not names or wanted <= 0:
            break
        for key in _candidate_keys(conn, dialect, job_type, task_limit, names, wanted, now):
            names = _open(queues, room)
            wanted = limit - len(claimed)
            if not names or wanted <= 0:
                break
            free = task_limit - _lock_and_count_key(conn, dialect, job_type, key)
            n = min(free, wanted, *(room[name] for name in names if name in room))
            if n > 0:
                lease(names, n, (job_type, key))
    # The unlimited jobs: the uncapped queues in one claim, each capped queue on its own.
    uncapped = [name for name in queues if name not in room]
    if uncapped and limit > len(claimed):
        lease(uncapped, limit - len(claimed), None)
    for name in queues:
        if name in room and room[name] > 0 and limit > len(claimed):
            lease([name], min(room[name], limit - len(claimed)), None)
    return claimed


def _open(names: Sequence[str], room: Mapping[str, int]) -> list[str]:
    """``names`` less the capped queues with no room left."""
    return [name for name in names if room.get(name, 1) > 0]


def _queue_room(
    conn: Connection, dialect: Dialect, limits: ClaimLimits, names: Sequence[str]
) -> dict[str, int]:
    """How many more jobs each capped queue of ``names`` may run, counted under its row lock."""
    capped = sorted(name for name in names if name in limits.queues)
    if not capped:
        return {}
    locked = conn.execute(
        dialect.lock_row(
            select(queues.c.name, queues.c.max_running)
            .where(queues.c.name.in_(capped))
            .order_by(queues.c.name)
        )
    ).all()
    # The limit as it is now (an operator may have changed it since the worker read it).
    current = {name: maximum for name, maximum in locked if maximum is not None}
    counted = conn.execute(
        select(jobs.c.queue, func.count())
        .where(jobs.c.status == "running", jobs.c.queue.in_(list(current)))
        .group_by(jobs.c.queue)
    ).all()
    running = {str(name): int(n) for name, n in counted}
    room = {name: max(0, maximum - int(running.get(name, 0))) for name, maximum in current.items()}
    return room


#: Where each task's walk over its keys starts next: keys take turns whatever their names sort
#: like (a fairness hint, per process; the limits never depend on it).
_next_start: dict[str, str] = {}

#: The most keys one claim looks at (index probes). A claim's cost stays bounded however many
#: keys are at their limit; the next claims look further, round the keys.
WALK_KEYS = 64


def _candidate_keys(
    conn: Connection,
    dialect: Dialect,
    job_type: str,
    task_limit: int,
    names: Sequence[str],
    wanted: int,
    now: datetime | None,
) -> list[str]:
    """Up to ``wanted`` keys of ``job_type`` with due jobs in ``names`` and room by this
    transaction's view, among the next :data:`WALK_KEYS` keys with waiting jobs past the last
    one looked at (then from the first again). Only a hint: the room is counted again under
    each key's lock. Returned in lock order."""
    start = _next_start.get(job_type)
    walked = conn.execute(
        candidate_keys_query(
            dialect, job_type, task_limit, names, max(WALK_KEYS, wanted), now, after=start
        )
    ).all()
    taken: list[str] = []
    last: str | None = None
    for key, eligible in walked:
        if key is None:  # the end of the keys: start from the first next time
            last = None
            break
        last = str(key)
        if eligible:
            taken.append(last)
            if len(taken) == wanted:
                break
    if last is None:
        _next_start.pop(job_type, None)
    else:
        _next_start[job_type] = last
    return sorted(taken)


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
    """The next ``steps`` keys of ``job_type`` with waiting jobs past ``after``, in key order,
    each with whether it has room and due jobs in ``names`` (a NULL key: no more keys). A loose
    index scan: a recursive walk from each waiting key to the next through the limited jobs'
    index, one probe a key, however many jobs wait behind it."""
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
    full = (
        select(jobs.c.limit_key)
        .where(jobs.c.job_type == job_type, jobs.c.status == "running")
        .where(jobs.c.limit_key.is_not(None))
        .group_by(jobs.c.limit_key)
        .having(func.count() >= task_limit)
    )
    due = (
        exists()
        .where(
            jobs.c.job_type == job_type,
            jobs.c.limit_key == walk.c.k,
            jobs.c.status.in_(waiting),
            jobs.c.queue.in_(list(names)),
            jobs.c.next_run_at <= dialect.now(now),
        )
        .correlate(walk)
    )
    eligible = case((and_(walk.c.k.not_in(full), due), 1), else_=0)
    return select(walk.c.k, eligible.label("eligible")).order_by(walk.c.n)


def _lock_and_count_key(conn: Connection, dialect: Dialect, job_type: str, key: str) -> int:
    """Take ``(job_type, key)``'s lock (its row is created on first use) and count its jobs
    running now."""
    conn.execute(
        dialect.conflict_insert(limit_keys)
        .values(job_type=job_type, limit_key=key)
        .on_conflict_do_nothing(index_elements=[limit_keys.c.job_type, limit_keys.c.limit_key])
    )
    conn.execute(
        dialect.lock_row(
            select(limit_keys.c.job_type).where(
                limit_keys.c.job_type == job_type, limit_keys.c.limit_key == key
            )
        )
    ).all()
    running = conn.execute(
        select(func.count()).where(
            jobs.c.job_type == job_type,
            jobs.c.limit_key == key,
            jobs.c.status == "running",
        )
    ).scalar_one()
    return int(running)
