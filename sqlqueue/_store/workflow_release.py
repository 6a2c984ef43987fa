"""Releasing a workflow's steps: the endings of a round's steps lower the counts of the steps
after them (``waiting_on``), and those with nothing left to wait for go from ``waiting`` to
``queued``, in the transaction that holds the workflows' rows (see
:mod:`sqlqueue._store.workflows`, whose :func:`~sqlqueue._store.workflows.advance` calls
:func:`release_after`). A constant number of statements for any number of steps, built once
per backend."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Connection,
    bindparam,
    case,
    func,
    literal,
    literal_column,
    select,
    true,
    update,
)

from sqlqueue._schema import jobs, workflow_edges, workflow_steps
from sqlqueue._store.claim_floor import Released
from sqlqueue._store.statement_cache import cached_statement
from sqlqueue.dialects import Dialect

__all__ = ["chunks", "lowered_steps", "release_after", "release_statement"]

#: Names or ids per ``IN (…)``: well under every backend's limit of bound values.
_CHUNK = 2000

_steps, _edges = workflow_steps, workflow_edges


def chunks(values: Sequence[Any]) -> Iterable[Sequence[Any]]:
    """``values`` in slices of at most ``_CHUNK``, for ``IN (…)`` lists."""
    for start in range(0, len(values), _CHUNK):
        yield values[start : start + _CHUNK]


def release_after(
    conn: Connection, dialect: Dialect, job_ids: list[int], now: datetime | None
) -> list[Released]:
    """Count the endings of steps ``job_ids`` in their downstream steps and release those with
    nothing left to wait for; return the steps released (with where they sort in claim order,
    which the releasing worker's claim floors go down to). A step's
    ending is counted once: its job ends once, and a step requeued after a counted ending is
    ``settled``.

    Where UPDATE has a native RETURNING, one UPDATE lowers the counts (of every step after
    those that ended, by how many of its upstreams ended) and returns them, and the steps at
    zero are released from that: one statement with PostgreSQL's writing CTEs, two on SQLite.
    The UPDATE locks each step row it lowers and computes from its newest version, so of two
    transactions ending a step's last two upstreams the second sees the first's count: one
    reaches zero. The statements are built once (see :func:`_release_statements`)."""
    if dialect.emulates_returning:
        return _release_after_locked(conn, dialect, job_ids, now)
    lowered, release = _release_statements(dialect, now)
    options = dialect.table_options
    released: list[Released] = []
    for chunk in chunks(sorted(job_ids)):
        if lowered is None:  # one statement: PostgreSQL
            rows = conn.execute(release, {"ended": list(chunk)}, execution_options=options)
        else:
            ready = [
                int(job_id)
                for job_id, waiting_on in conn.execute(
                    lowered, {"ended": list(chunk)}, execution_options=options
                )
                if waiting_on <= 0
            ]
            if not ready:
                continue
            rows = conn.execute(release, {"ready": ready}, execution_options=options)
        released.extend(_released(*row[: len(_RETURNED)]) for row in rows)
    return released


#: What a release returns of each step it released (then the dialect's wake-up columns).
_RETURNED = (jobs.c.id, jobs.c.queue, jobs.c.job_type, jobs.c.priority, jobs.c.next_run_at)


def _released(job_id: Any, queue: Any, job_type: Any, priority: Any, due: Any) -> Released:
    return Released(
        job_id=int(job_id), queue=str(queue), job_type=str(job_type), priority=int(priority),
        due=due,
    )  # fmt: skip


def _release_statements(dialect: Dialect, now: datetime | None) -> tuple[Any, Any]:
    """``(lower, release)``: the UPDATE lowering the counts of the steps after ``:ended`` and
    the one releasing ``:ready``; or ``(None, both in one)`` where writing CTEs exist. Built
    once per backend and wake-up channel (building them cost more CPU than running them);
    an injected ``now`` builds them afresh."""
    if now is None:
        key = ("release_after", type(dialect), dialect.wake_channel)
        return cached_statement(key, lambda: _build_release(dialect, None))
    return _build_release(dialect, now)


def _build_release(dialect: Dialect, now: datetime | None) -> tuple[Any, Any]:
    ended = bindparam("ended", expanding=True, type_=_steps.c.job_id.type)
    if not dialect.supports_modifying_ctes:
        returned = (*_RETURNED, *dialect.wake_columns())
        ready = bindparam("ready", expanding=True, type_=jobs.c.id.type)
        release = _release(dialect, now).where(jobs.c.id.in_(ready))
        return _lowered(lambda up: [up.c.job_id.in_(ended)], lateral=False), release.returning(
            *returned
        )
    lowered = lowered_steps(lambda upstream: [upstream.c.job_id.in_(ended)])
    return None, release_statement(dialect, now, lowered)


def lowered_steps(ended: Callable[[Any], list[Any]]) -> Any:
    """Where writing CTEs exist: the CTE lowering the counts of the steps after those that
    ``ended`` (its conditions on an alias of the steps table), returning each step's
    ``job_id``, ``waiting_on`` and a ``status`` of ``'waiting'`` for :func:`release_statement`."""
    return (
        _lowered(ended, lateral=True)
        .returning(literal("waiting").label("status"))
        .cte("sqlqueue_lowered")
    )


def release_statement(dialect: Dialect, now: datetime | None, lowered: Any) -> Any:
    """The UPDATE releasing the steps that ``lowered`` (:func:`lowered_steps`) brought to zero,
    returning what :data:`_RETURNED` names (and waking workers where the backend can).

    The jobs are found by id from the lowered steps, and their status compared with one those
    return, through an expression no index has: a condition the status index can serve (on
    the jobs table alone, or ``status = sqlqueue_lowered.status``) had the planner walk every
    waiting job by that index for each step released, its estimate for a fresh table being a
    few rows (a 3,000-step fan-out took 375 ms to release, 1,500 index entries per step)."""
    unindexed = jobs.c.status.concat(literal_column("''"))
    both = _release(dialect, now, status=lowered.c.status, column=unindexed).where(
        jobs.c.id == lowered.c.job_id, lowered.c.waiting_on <= 0
    )
    return both.returning(*_RETURNED, *dialect.wake_columns())


def _lowered(ended: Callable[[Any], list[Any]], *, lateral: bool) -> Any:
    """``UPDATE … RETURNING job_id, waiting_on``: the steps after those that ``ended`` (its
    conditions on an alias of the steps table) and whose ending was not counted before a
    requeue (``settled``) wait for as many fewer upstreams.

    Each lookup goes by a unique key, which the planner estimates right without statistics:
    the step of a job (``job_id`` is unique), then its edges by the primary key's leading
    columns, then each step after it by its primary key. ``lateral`` (PostgreSQL) reads the
    edges per step in a LATERAL subquery that ``OFFSET 0`` keeps apart, so they are looked up
    by key rather than scanned whole and hashed, which a fresh table's low estimate invites."""
    upstream = _steps.alias("sqlqueue_upstream")
    match = (_edges.c.workflow_id == upstream.c.workflow_id) & (
        _edges.c.upstream == upstream.c.name
    )
    after: Any
    if lateral:
        after = (select(_edges.c.workflow_id, _edges.c.downstream).where(match).offset(0)).lateral(
            "sqlqueue_after"
        )
        graph = upstream.join(after, true())
    else:
        after = _edges
        graph = upstream.join(_edges, match)
    ended_steps = (
        select(after.c.workflow_id, after.c.downstream, func.count().label("ended"))
        .select_from(graph)
        .where(*ended(upstream), upstream.c.settled.is_(False))
        .group_by(after.c.workflow_id, after.c.downstream)
        .subquery("sqlqueue_ended")
    )
    return (
        update(_steps)
        .where(
            _steps.c.workflow_id == ended_steps.c.workflow_id,
            _steps.c.name == ended_steps.c.downstream,
        )
        .values(waiting_on=_steps.c.waiting_on - ended_steps.c.ended)
        .returning(_steps.c.job_id, _steps.c.waiting_on)
    )


def _release(
    dialect: Dialect, now: datetime | None, *, status: Any = "waiting", column: Any = None
) -> Any:
    """``UPDATE`` of waiting steps (``status``: an expression worth ``'waiting'``, compared
    with ``column``, an expression worth the jobs' status) to ``queued``, due now (or when
    they asked to run, if later: a claim floor sees them at once); the caller adds which."""
    current = dialect.now(now)
    return (
        update(jobs)
        .where((jobs.c.status if column is None else column) == status)
        .values(
            status="queued",
            next_run_at=case((jobs.c.next_run_at > current, jobs.c.next_run_at), else_=current),
            updated_at=current,
        )
    )


def _release_after_locked(
    conn: Connection, dialect: Dialect, job_ids: list[int], now: datetime | None
) -> list[Released]:
    """:func:`release_after` where RETURNING is emulated (MariaDB/MySQL): a locking read of
    the counts (and the steps' claim order), the lower counts, the release: three statements
    for any number of steps. A step's due time is the one it had: a release moves it to now
    only when it was earlier (which a floor, going down to it, sees too)."""
    options = dialect.table_options
    upstream, downstream = _steps.alias("upstream"), _steps.alias("downstream")
    graph = _edges.join(
        upstream,
        (upstream.c.workflow_id == _edges.c.workflow_id) & (upstream.c.name == _edges.c.upstream),
    ).join(
        downstream,
        (downstream.c.workflow_id == _edges.c.workflow_id)
        & (downstream.c.name == _edges.c.downstream),
    )
    after: Counter[int] = Counter()
    waiting: dict[int, int] = {}
    steps: dict[int, Released] = {}
    for chunk in chunks(sorted(job_ids)):
        # Locked: read after the workflow's row, the count is the one the last writer left.
        for job_id, waiting_on, *order in conn.execute(
            dialect.lock_row(
                select(downstream.c.job_id, downstream.c.waiting_on, *_RETURNED)
                .select_from(graph.join(jobs, jobs.c.id == downstream.c.job_id))
                .where(upstream.c.job_id.in_(chunk), upstream.c.settled.is_(False))
            ),
            execution_options=options,
        ):
            after[int(job_id)] += 1
            waiting[int(job_id)] = int(waiting_on)
            steps[int(job_id)] = _released(*order)
    if not after:
        return []
    ready = sorted(job_id for job_id, count in after.items() if waiting[job_id] - count <= 0)
    by_decrement: dict[int, list[int]] = {}
    for job_id, count in after.items():
        by_decrement.setdefault(count, []).append(job_id)
    for count, group in by_decrement.items():
        for chunk in chunks(sorted(group)):
            conn.execute(
                update(_steps)
                .where(_steps.c.job_id.in_(chunk))
                .values(waiting_on=_steps.c.waiting_on - count),
                execution_options=options,
            )
    released: list[Released] = []
    for chunk in chunks(ready):
        stmt = _release(dialect, now).where(jobs.c.id.in_(chunk))
        if conn.execute(stmt, execution_options=options).rowcount:
            released.extend(steps[job_id] for job_id in chunk)
    return released
