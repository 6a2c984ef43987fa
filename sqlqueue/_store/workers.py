"""The live workers (``sqlqueue_workers``): each worker writes its row every heartbeat interval
and deletes it at a clean exit; a row past its ``expires_at`` is a worker gone without a word,
kept until retention prunes it (:func:`prune_gone_workers`).
Health reads which job types the live workers of each queue know, and which overdue jobs are of
types none of them knows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, delete, func, select

from sqlqueue._schema import jobs, workers
from sqlqueue._worker_info import WorkerInfo
from sqlqueue.dialects import Dialect

__all__ = [
    "LiveWorker",
    "OverdueType",
    "SeenWorker",
    "announce_worker",
    "prune_gone_workers",
    "read_live_workers",
    "read_overdue_types",
    "read_seen_workers",
    "read_workers",
    "remove_worker",
]


@dataclass(frozen=True, kw_only=True)
class LiveWorker:
    """A live worker as health needs it: the queues it serves and the job types it knows
    (``None``: it claims every type)."""

    id: str
    queues: frozenset[str]
    job_types: frozenset[str] | None


@dataclass(frozen=True, kw_only=True)
class OverdueType:
    """Jobs of one type in one queue due for longer than a threshold: how many, and how long
    the oldest has waited (seconds, database clock)."""

    queue: str
    job_type: str
    count: int
    age_seconds: float


@dataclass(frozen=True, kw_only=True)
class SeenWorker:
    """A worker's row as the ``no_workers`` alarm needs it: the queues it serves, whether it
    is alive, and how long ago it last wrote its row (seconds, database clock)."""

    queues: frozenset[str]
    alive: bool
    seen_seconds_ago: float


def announce_worker(
    conn: Connection,
    dialect: Dialect,
    *,
    worker_id: str,
    facts: Mapping[str, Any],
    expires_in: float,
) -> None:
    """Write (or refresh) ``worker_id``'s row: ``facts`` are its columns other than the times;
    it counts as live for ``expires_in`` seconds. One statement: the heartbeat's transaction
    carries it."""
    current = dialect.now()
    expires_at = dialect.now_plus(float(expires_in))
    seen = {**facts, "last_seen_at": current, "expires_at": expires_at}
    dialect.execute_returning(
        conn,
        dialect.upsert(
            workers,
            values={"id": worker_id, "started_at": current, **seen},
            conflict=["id"],
            set_=seen,
            where=workers.c.id == worker_id,
        ),
    )


def prune_gone_workers(conn: Connection, dialect: Dialect, *, older_than: float) -> int:
    """Delete the rows of workers gone without a word whose last heartbeat is more than
    ``older_than`` seconds old (database clock); return how many went. A live worker's row
    stays, however old its last heartbeat."""
    stmt = delete(workers).where(
        workers.c.expires_at <= dialect.now(),
        workers.c.last_seen_at < dialect.now_plus(-float(older_than)),
    )
    return int(conn.execute(stmt).rowcount)


def remove_worker(conn: Connection, *, worker_id: str) -> None:
    """Delete ``worker_id``'s row: it stopped cleanly."""
    conn.execute(delete(workers).where(workers.c.id == worker_id))


def read_live_workers(conn: Connection, dialect: Dialect) -> list[LiveWorker]:
    """The workers whose rows have not expired, by id."""
    query = (
        select(workers.c.id, workers.c.queues, workers.c.job_types)
        .where(workers.c.expires_at > dialect.now())
        .order_by(workers.c.id)
    )
    return [
        LiveWorker(
            id=row.id,
            queues=frozenset(row.queues),
            job_types=None if row.job_types is None else frozenset(row.job_types),
        )
        for row in conn.execute(query)
    ]


def read_workers(conn: Connection, dialect: Dialect, *, include_gone: bool) -> list[WorkerInfo]:
    """The workers' rows, live ones first, each group by host, pid and id; ``include_gone``: the
    expired rows too (workers gone without a word, kept until retention prunes them)."""
    alive = (workers.c.expires_at > dialect.now()).label("alive")
    query = select(workers, alive).order_by(
        alive.desc(), workers.c.host, workers.c.pid, workers.c.id
    )
    if not include_gone:
        query = query.where(workers.c.expires_at > dialect.now())
    return [
        WorkerInfo(
            id=row.id,
            host=row.host,
            pid=int(row.pid),
            version=row.version,
            queues={str(name): int(limit) for name, limit in dict(row.queues).items()},
            started_at=row.started_at,
            last_seen_at=row.last_seen_at,
            running=int(row.running),
            stopping=bool(row.stopping),
            alive=bool(row.alive),
        )
        for row in conn.execute(query)
    ]


def read_seen_workers(conn: Connection, dialect: Dialect) -> list[SeenWorker]:
    """Every worker's row, live or gone (until retention prunes it), with its age."""
    current = dialect.now()
    query = select(
        workers.c.queues,
        (workers.c.expires_at > current).label("alive"),
        dialect.seconds_between(current, workers.c.last_seen_at).label("ago"),
    )
    return [
        SeenWorker(
            queues=frozenset(row.queues),
            alive=bool(row.alive),
            seen_seconds_ago=max(0.0, float(row.ago)),
        )
        for row in conn.execute(query)
    ]


def read_overdue_types(
    conn: Connection, dialect: Dialect, *, queues: Sequence[str], older_than: float
) -> list[OverdueType]:
    """Per queue of ``queues`` and job type: the claimable jobs due more than ``older_than``
    seconds ago, how many and the oldest's age. Health asks only about queues whose oldest due
    job is already over the threshold, so a healthy queue costs nothing."""
    if not queues:
        return []
    current = dialect.now()
    age = dialect.seconds_between(current, func.min(jobs.c.next_run_at)).label("age")
    query = (
        select(jobs.c.queue, jobs.c.job_type, func.count().label("n"), age)
        .where(
            jobs.c.status.in_(("queued", "failed")),
            jobs.c.queue.in_(list(queues)),
            jobs.c.next_run_at <= dialect.now_plus(-float(older_than)),
        )
        .group_by(jobs.c.queue, jobs.c.job_type)
        .order_by(jobs.c.queue, jobs.c.job_type)
    )
    return [
        OverdueType(
            queue=row.queue,
            job_type=row.job_type,
            count=int(row.n),
            age_seconds=max(0.0, float(row.age)),
        )
        for row in conn.execute(query)
    ]
