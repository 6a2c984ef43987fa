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

Round trips, as the claim's latency is mostly theirs: the walk (which also says whether any
job without a limit is due: if none is, the plain claim is skipped), then for the keys it found
one statement that locks them all and one that counts them all, then one claim per key with
room (see ``key_walk.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import Connection, func, select

from sqlqueue._schema import jobs, limit_keys, queues
from sqlqueue._store import claim as plain
from sqlqueue._store.claim_floor import ClaimFloors
from sqlqueue._store.key_walk import RUNNING, walk_keys
from sqlqueue._store.rows import ClaimedJob
from sqlqueue.dialects import Dialect

__all__ = ["ClaimLimits", "claim_within_limits"]


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
    unlimited_due = True  # until a walk saw none

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
        walk = walk_keys(
            conn,
            dialect,
            job_type=job_type,
            task_limit=task_limit,
            names=names,
            queues=queues,
            job_types=job_types,
            wanted=wanted,
            now=now,
        )
        unlimited_due = walk.unlimited_due
        if not walk.keys:
            continue
        running = _lock_and_count_keys(conn, dialect, job_type, walk.keys)
        for key in walk.keys:
            names = _open(queues, room)
            wanted = limit - len(claimed)
            if not names or wanted <= 0:
                break
            free = task_limit - running.get(key, 0)
            n = min(free, wanted, *(room[name] for name in names if name in room))
            if n > 0:
                lease(names, n, (job_type, key))
    if not unlimited_due:
        return claimed
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
        .where(jobs.c.status == RUNNING, jobs.c.queue.in_(list(current)))
        .group_by(jobs.c.queue)
    ).all()
    running = {str(name): int(n) for name, n in counted}
    room = {name: max(0, maximum - int(running.get(name, 0))) for name, maximum in current.items()}
    return room


def _lock_and_count_keys(
    conn: Connection, dialect: Dialect, job_type: str, keys: Sequence[str]
) -> dict[str, int]:
    """Take the locks of ``job_type``'s ``keys`` (their rows are created on first use), in key
    order, then count each key's jobs running now: one statement for the locks (two more for
    keys never seen before) and one for the counts, however many keys."""
    locked = _lock_keys(conn, dialect, job_type, keys)
    missing = sorted(set(keys) - locked)
    if missing:
        # Created, then locked: a claimer that holds keys it created waits for no other lock
        # (the locks above come first, the claims skip locked rows), so no wait goes round.
        conn.execute(
            dialect.conflict_insert(limit_keys)
            .values([{"job_type": job_type, "limit_key": key} for key in missing])
            .on_conflict_do_nothing(index_elements=[limit_keys.c.job_type, limit_keys.c.limit_key])
        )
        _lock_keys(conn, dialect, job_type, missing)
    # A new statement: under READ COMMITTED it sees every claim committed before the locks
    # were granted.
    counted = conn.execute(
        select(jobs.c.limit_key, func.count())
        .where(
            jobs.c.job_type == job_type,
            jobs.c.limit_key.in_(list(keys)),
            jobs.c.status == RUNNING,
            jobs.c.limit_key.is_not(None),  # ix_sqlqueue_jobs_limit_running's predicate
        )
        .group_by(jobs.c.limit_key)
    ).all()
    return {str(key): int(n) for key, n in counted}


def _lock_keys(conn: Connection, dialect: Dialect, job_type: str, keys: Sequence[str]) -> set[str]:
    """Lock the rows of ``job_type``'s ``keys`` that exist, in key order; their keys."""
    rows = conn.execute(
        dialect.lock_row(
            select(limit_keys.c.limit_key)
            .where(limit_keys.c.job_type == job_type, limit_keys.c.limit_key.in_(list(keys)))
            .order_by(limit_keys.c.limit_key)
        )
    ).all()
    return {str(key) for (key,) in rows}
