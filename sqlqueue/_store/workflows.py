"""Workflows: their steps and edges written, and each step released exactly once, in the
transaction that ends its last upstream step.

A workflow is a batch (``sqlqueue_batches`` row with ``workflow_on_dead`` set) whose children
are its steps, so every path that ends a job already notes the ending in
:class:`~sqlqueue._store.batches.Endings` and calls :func:`~sqlqueue._store.batches.settle`,
which holds the workflow's row and calls :func:`advance` here with the steps that ended. Each
step row counts its upstream steps not yet ended (``waiting_on``): an ending reads the counts
of its direct downstream steps (one statement for every step of the round), writes their
lower counts in one statement per distinct decrement (one, in practice), and the steps that
reach zero go from ``waiting`` to ``queued`` in one more — no statement per sibling, and no
second read of the counts (the first, locked, knows them). Nothing is written
to the step that ended: its job's status says it was counted, and ``settled`` marks a step
whose ending was counted by the job it had before a requeue (under ``on_dead="run"``), so
its new job's ending never counts twice.

Reads that decide a write lock their rows (``FOR UPDATE``): after waiting for the workflow's
row they see what the transaction before committed, on MariaDB's snapshots too.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Connection,
    bindparam,
    case,
    delete,
    func,
    insert,
    literal,
    select,
    true,
    update,
)

from sqlqueue._jobrow import JobRow
from sqlqueue._schema import batches, jobs, workflow_edges, workflow_steps
from sqlqueue._store.inserts import insert_rows
from sqlqueue._store.statement_cache import cached_statement
from sqlqueue.dialects import Dialect

__all__ = [
    "add_step",
    "advance",
    "create_steps",
    "forget_steps",
    "replace_steps",
]

#: Names or ids per ``IN (…)``: well under every backend's limit of bound values.
_CHUNK = 2000

_steps, _edges = workflow_steps, workflow_edges


def _chunks(values: Sequence[Any]) -> Iterable[Sequence[Any]]:
    for start in range(0, len(values), _CHUNK):
        yield values[start : start + _CHUNK]


# -- writing ------------------------------------------------------------------------------------


def create_steps(
    conn: Connection,
    dialect: Dialect,
    workflow_id: int,
    *,
    names: Sequence[str],
    job_ids: Sequence[int],
    after: Mapping[str, Sequence[str]],
) -> None:
    """Write the steps (just inserted as ``job_ids``, queued, children of ``workflow_id``) and
    their edges, and put the steps with upstreams in ``waiting``; the caller's transaction."""
    options = dialect.table_options
    waiting = [job_id for name, job_id in zip(names, job_ids, strict=True) if after[name]]
    current = dialect.now()
    for chunk in _chunks(waiting):
        conn.execute(
            update(jobs).where(jobs.c.id.in_(chunk)).values(status="waiting", updated_at=current),
            execution_options=options,
        )
    step_rows = [
        {
            "workflow_id": workflow_id,
            "name": name,
            "job_id": job_id,
            "waiting_on": len(after[name]),
            "settled": False,
        }
        for name, job_id in zip(names, job_ids, strict=True)
    ]
    for chunk in _chunks(step_rows):
        conn.execute(insert(_steps), list(chunk), execution_options=options)
    edge_rows = [
        {"workflow_id": workflow_id, "upstream": upstream, "downstream": name}
        for name in names
        for upstream in after[name]
    ]
    for chunk in _chunks(edge_rows):
        conn.execute(insert(_edges), list(chunk), execution_options=options)


def add_step(
    conn: Connection,
    dialect: Dialect,
    workflow_id: int,
    *,
    name: str,
    row: JobRow,
    after: Sequence[str],
) -> int:
    """Add step ``name`` (job ``row``) to running workflow ``workflow_id`` after the steps in
    ``after``; return its job id. Takes the workflow's row first, so no upstream can end
    unseen meanwhile; :class:`LookupError` naming what is wrong (the caller words the error)."""
    options = dialect.table_options
    head = conn.execute(
        dialect.lock_row(
            select(batches.c.finished_at, batches.c.workflow_on_dead).where(
                batches.c.id == workflow_id
            )
        ),
        execution_options=options,
    ).first()
    if head is None or head[1] is None:
        raise LookupError(f"batch {workflow_id} is not a workflow")
    if head[0] is not None:
        raise LookupError(f"workflow {workflow_id} has finished")
    found = conn.execute(
        dialect.lock_row(
            select(_steps.c.name, _steps.c.settled, _steps.c.job_id).where(
                _steps.c.workflow_id == workflow_id,
                _steps.c.name.in_([name, *after]),
            )
        ),
        execution_options=options,
    ).all()
    if any(str(row[0]) == name for row in found):
        raise LookupError(f"step {name!r} is already in workflow {workflow_id}")
    known = {str(row[0]) for row in found}
    unknown = [upstream for upstream in after if upstream not in known]
    if unknown:
        raise LookupError(f"workflow {workflow_id} has no step {unknown[0]!r}")
    counted = _counted(conn, dialect, str(head[1]), found)
    pending = sum(1 for upstream in after if upstream not in counted)
    conn.execute(  # the workflow cannot finish before the new step ends
        update(batches).where(batches.c.id == workflow_id).values(total=batches.c.total + 1),
        execution_options=options,
    )
    job_id = insert_rows(dialect, conn, [{**row, "batch_id": workflow_id}])[0]
    if pending:
        conn.execute(
            update(jobs).where(jobs.c.id == job_id).values(status="waiting"),
            execution_options=options,
        )
    conn.execute(
        insert(_steps).values(
            workflow_id=workflow_id, name=name, job_id=job_id, waiting_on=pending, settled=False
        ),
        execution_options=options,
    )
    if after:
        conn.execute(
            insert(_edges),
            [{"workflow_id": workflow_id, "upstream": up, "downstream": name} for up in after],
            execution_options=options,
        )
    return job_id


def _counted(conn: Connection, dialect: Dialect, on_dead: str, steps: Sequence[Any]) -> set[str]:
    """The names among ``steps`` (``(name, settled, job id)``, read under the workflow's row)
    whose ending the steps after them have counted: marked ``settled``, or their job ended as
    ``advance`` counts it. The jobs are read without a lock: a transaction ending one of them
    holds its row while it waits for the workflow's row, which this one holds; what it has
    not committed, it will count in the steps after it (new ones included) once it has it."""
    counting = {"succeeded", "dead", "cancelled"} if on_dead == "run" else {"succeeded"}
    statuses = dict(
        conn.execute(
            select(jobs.c.id, jobs.c.status).where(jobs.c.id.in_([row[2] for row in steps])),
            execution_options=dialect.table_options,
        ).all()
    )
    return {
        str(name) for name, settled, job_id in steps if settled or statuses.get(job_id) in counting
    }


def replace_steps(conn: Connection, dialect: Dialect, moves: Sequence[tuple[int, int]]) -> None:
    """Requeued dead jobs ``(old id, new id)``: each new job takes the old one's place in its
    workflow step (a job outside any workflow matches no step row). Under
    ``on_dead="run"`` the old job's ending was counted in the steps after it: the step is
    marked ``settled``, so its new job's ending does not count again."""
    if moves:
        run = (
            select(batches.c.workflow_on_dead)
            .where(batches.c.id == _steps.c.workflow_id)
            .scalar_subquery()
        ) == "run"
        conn.execute(
            update(_steps)
            .where(_steps.c.job_id == _bind("old_id"))
            .values(job_id=_bind("new_id"), settled=case((run, True), else_=_steps.c.settled)),
            [{"old_id": old, "new_id": new} for old, new in moves],
            execution_options=dialect.table_options,
        )


def _bind(name: str) -> Any:
    return bindparam(name, type_=_steps.c.job_id.type)


# -- ending steps -------------------------------------------------------------------------------


def advance(
    conn: Connection,
    dialect: Dialect,
    ended: Mapping[int, tuple[str, Sequence[tuple[int, str]]]],
    now: datetime | None = None,
) -> tuple[dict[int, int], list[tuple[int, str]]]:
    """Apply the endings of workflow steps, ``{workflow id: (on_dead, [(job id, status)])}``,
    whose workflow rows the caller holds: release the downstream steps whose upstreams have all
    ended (one set of statements for every workflow of the round, none per step), and, under
    ``on_dead="cancel"``, cancel every step after a dead or cancelled one. Returns how many
    steps were cancelled in each workflow (the caller counts them in its row), and the
    ``(job id, queue)`` of the steps released."""
    counted = [
        job_id
        for on_dead, steps in ended.values()
        for job_id, status in steps
        if status == "succeeded" or on_dead == "run"
    ]
    released = _release_after(conn, dialect, counted, now) if counted else []
    cancelled: dict[int, int] = {}
    for workflow_id, (on_dead, steps) in ended.items():
        stopped = [job_id for job_id, status in steps if status != "succeeded"]
        if stopped and on_dead == "cancel":
            cancelled[workflow_id] = _cancel_after(conn, dialect, workflow_id, stopped, now)
    return cancelled, released


def _release_after(
    conn: Connection, dialect: Dialect, job_ids: list[int], now: datetime | None
) -> list[tuple[int, str]]:
    """Count the endings of steps ``job_ids`` in their downstream steps and release those with
    nothing left to wait for; return the ``(job id, queue)`` of the steps released. A step's
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
    released: list[tuple[int, str]] = []
    for chunk in _chunks(sorted(job_ids)):
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
        released.extend((int(row[0]), str(row[1])) for row in rows)
    return released


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
    returned = (jobs.c.id, jobs.c.queue, *dialect.wake_columns())
    ended = bindparam("ended", expanding=True, type_=_steps.c.job_id.type)
    if not dialect.supports_modifying_ctes:
        ready = bindparam("ready", expanding=True, type_=jobs.c.id.type)
        release = _release(dialect, now).where(jobs.c.id.in_(ready))
        return _lowered(ended, lateral=False), release.returning(*returned)
    # The jobs are found by id from the lowered steps, and their status compared with one
    # those return: no condition on the jobs table alone, which the planner could use to walk
    # every waiting job by the status index (its estimate for a fresh table is a few rows).
    counts = (
        _lowered(ended, lateral=True)
        .returning(literal("waiting").label("status"))
        .cte("sqlqueue_lowered")
    )
    both = _release(dialect, now, status=counts.c.status).where(
        jobs.c.id == counts.c.job_id, counts.c.waiting_on <= 0
    )
    return None, both.returning(*returned)


def _lowered(ended: Any, *, lateral: bool) -> Any:
    """``UPDATE … RETURNING job_id, waiting_on``: the steps after those whose jobs are
    ``ended`` (and whose ending was not counted before a requeue, ``settled``) wait for as
    many fewer upstreams.

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
        .where(upstream.c.job_id.in_(ended), upstream.c.settled.is_(False))
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


def _release(dialect: Dialect, now: datetime | None, *, status: Any = "waiting") -> Any:
    """``UPDATE`` of waiting steps (``status``: an expression worth ``'waiting'``) to
    ``queued``, due now (or when they asked to run, if later: a claim floor sees them at
    once); the caller adds which."""
    current = dialect.now(now)
    return (
        update(jobs)
        .where(jobs.c.status == status)
        .values(
            status="queued",
            next_run_at=case((jobs.c.next_run_at > current, jobs.c.next_run_at), else_=current),
            updated_at=current,
        )
    )


def _release_after_locked(
    conn: Connection, dialect: Dialect, job_ids: list[int], now: datetime | None
) -> list[tuple[int, str]]:
    """:func:`_release_after` where RETURNING is emulated (MariaDB/MySQL): a locking read of
    the counts (and the steps' queues), the lower counts, the release: three statements for
    any number of steps."""
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
    queues: dict[int, str] = {}
    for chunk in _chunks(sorted(job_ids)):
        # Locked: read after the workflow's row, the count is the one the last writer left.
        for job_id, waiting_on, queue in conn.execute(
            dialect.lock_row(
                select(downstream.c.job_id, downstream.c.waiting_on, jobs.c.queue)
                .select_from(graph.join(jobs, jobs.c.id == downstream.c.job_id))
                .where(upstream.c.job_id.in_(chunk), upstream.c.settled.is_(False))
            ),
            execution_options=options,
        ):
            after[int(job_id)] += 1
            waiting[int(job_id)] = int(waiting_on)
            queues[int(job_id)] = str(queue)
    if not after:
        return []
    ready = sorted(job_id for job_id, count in after.items() if waiting[job_id] - count <= 0)
    by_decrement: dict[int, list[int]] = {}
    for job_id, count in after.items():
        by_decrement.setdefault(count, []).append(job_id)
    for count, group in by_decrement.items():
        for chunk in _chunks(sorted(group)):
            conn.execute(
                update(_steps)
                .where(_steps.c.job_id.in_(chunk))
                .values(waiting_on=_steps.c.waiting_on - count),
                execution_options=options,
            )
    released: list[tuple[int, str]] = []
    for chunk in _chunks(ready):
        stmt = _release(dialect, now).where(jobs.c.id.in_(chunk))
        if conn.execute(stmt, execution_options=options).rowcount:
            released.extend((job_id, queues[job_id]) for job_id in chunk)
    return released


def _cancel_after(
    conn: Connection, dialect: Dialect, workflow_id: int, job_ids: list[int], now: datetime | None
) -> int:
    options = dialect.table_options
    origins = list(
        conn.execute(
            select(_steps.c.name).where(
                _steps.c.workflow_id == workflow_id, _steps.c.job_id.in_(job_ids)
            ),
            execution_options=options,
        ).scalars()
    )
    after: dict[str, list[str]] = {}
    for upstream, downstream in conn.execute(
        select(_edges.c.upstream, _edges.c.downstream).where(_edges.c.workflow_id == workflow_id),
        execution_options=options,
    ):
        after.setdefault(str(upstream), []).append(str(downstream))
    seen: set[str] = set()
    todo = deque(origins)
    while todo:
        for child in after.get(todo.popleft(), []):
            if child not in seen:
                seen.add(child)
                todo.append(child)
    if not seen:
        return 0
    targets: list[int] = []
    for chunk in _chunks(sorted(seen)):
        targets.extend(
            conn.execute(
                select(_steps.c.job_id).where(
                    _steps.c.workflow_id == workflow_id, _steps.c.name.in_(chunk)
                ),
                execution_options=options,
            ).scalars()
        )
    current = dialect.now(now)
    reason = (
        f"cancelled by its workflow (on_dead='cancel'): step {', '.join(map(repr, origins))} "
        "that it runs after ended dead or cancelled"
    )
    cancelled = 0
    for chunk in _chunks(targets):
        cancelled += conn.execute(
            update(jobs)
            .where(jobs.c.id.in_(chunk), jobs.c.status == "waiting")
            .values(status="cancelled", finished_at=current, updated_at=current, last_error=reason),
            execution_options=options,
        ).rowcount
    return cancelled


# -- retention ----------------------------------------------------------------------------------


def forget_steps(conn: Connection, dialect: Dialect, workflow_ids: Sequence[int]) -> None:
    """Delete the steps and edges of workflows whose row is gone (retention pruned it)."""
    if not workflow_ids:
        return
    alive = select(batches.c.id).where(batches.c.id.in_(workflow_ids))
    gone = sorted(set(workflow_ids) - set(conn.execute(alive).scalars()))
    for table in (_steps, _edges):
        for chunk in _chunks(gone):
            conn.execute(
                delete(table).where(table.c.workflow_id.in_(chunk)),
                execution_options=dialect.table_options,
            )
