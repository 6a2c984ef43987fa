"""Workflows: their steps and edges written, and each step released exactly once, in the
transaction that ends its last upstream step.

A workflow is a batch (``sqlqueue_batches`` row with ``workflow_on_dead`` set) whose children
are its steps, so every path that ends a job already notes the ending in
:class:`~sqlqueue._store.batches.Endings` and calls :func:`~sqlqueue._store.batches.settle`,
which holds the workflow's row and calls :func:`advance` here with the steps that ended. Each
step row counts its upstream steps not yet ended (``waiting_on``): the endings of a round
lower the counts of their direct downstream steps and release those that reach zero in one
statement on PostgreSQL, two on SQLite, three on MariaDB, for every step of the round and
none per sibling (see :mod:`sqlqueue._store.workflow_release`). Nothing is written
to the step that ended: its job's status says it was counted, and ``settled`` marks a step
whose ending was counted by the job it had before a requeue (under ``on_dead="run"``), so
its new job's ending never counts twice.

Reads that decide a write lock their rows (``FOR UPDATE``): after waiting for the workflow's
row they see what the transaction before committed, on MariaDB's snapshots too.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Connection,
    bindparam,
    case,
    delete,
    insert,
    select,
    update,
)

from sqlqueue._jobrow import JobRow
from sqlqueue._schema import batches, jobs, workflow_edges, workflow_steps
from sqlqueue._store.claim_floor import Released
from sqlqueue._store.inserts import insert_rows
from sqlqueue._store.workflow_release import chunks, release_after
from sqlqueue.dialects import Dialect

__all__ = [
    "add_step",
    "advance",
    "create_steps",
    "forget_steps",
    "replace_steps",
]

_steps, _edges = workflow_steps, workflow_edges


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
    for chunk in chunks(waiting):
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
    for chunk in chunks(step_rows):
        conn.execute(insert(_steps), list(chunk), execution_options=options)
    edge_rows = [
        {"workflow_id": workflow_id, "upstream": upstream, "downstream": name}
        for name in names
        for upstream in after[name]
    ]
    for chunk in chunks(edge_rows):
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
    stopped = _stopped(conn, dialect, found, after) if head[1] == "cancel" and after else []
    grown: dict[str, Any] = {"total": batches.c.total + 1}
    if stopped:  # ended as soon as written: counted as the cancels of ``advance`` are
        grown["cancelled"] = batches.c.cancelled + 1
    conn.execute(  # the workflow cannot finish before the new step ends
        update(batches).where(batches.c.id == workflow_id).values(**grown),
        execution_options=options,
    )
    job_id = insert_rows(dialect, conn, [{**row, "batch_id": workflow_id}])[0]
    if stopped:
        _cancel_added(conn, dialect, job_id, stopped)
    elif pending:
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


def _stopped(
    conn: Connection, dialect: Dialect, steps: Sequence[Any], after: Sequence[str]
) -> list[str]:
    """The names in ``after`` whose step's job (``steps``: ``(name, settled, job id)``, read
    under the workflow's row) ended dead or cancelled: under ``on_dead="cancel"`` a step added
    after one of them is cancelled at once, as it would have been had it been there before."""
    jobs_of = {int(job_id): str(name) for name, _, job_id in steps if str(name) in after}
    ended = conn.execute(
        select(jobs.c.id).where(
            jobs.c.id.in_(sorted(jobs_of)), jobs.c.status.in_(("dead", "cancelled"))
        ),
        execution_options=dialect.table_options,
    ).scalars()
    return sorted(jobs_of[int(job_id)] for job_id in ended)


def _cancel_added(conn: Connection, dialect: Dialect, job_id: int, stopped: list[str]) -> None:
    """Cancel the step just added as job ``job_id`` after the ended steps ``stopped``."""
    current = dialect.now()
    reason = (
        f"cancelled by its workflow (on_dead='cancel'): step {', '.join(map(repr, stopped))} "
        "that it runs after had ended dead or cancelled when it was added"
    )
    conn.execute(
        update(jobs)
        .where(jobs.c.id == job_id)
        .values(status="cancelled", finished_at=current, updated_at=current, last_error=reason),
        execution_options=dialect.table_options,
    )


def replace_steps(conn: Connection, dialect: Dialect, moves: Sequence[tuple[int, int]]) -> None:
    """Requeued dead jobs ``(old id, new id)``: in a workflow that has not finished, each new
    job takes the old one's place in its step (a job outside any workflow matches no step
    row). Under ``on_dead="run"`` the old job's ending was counted in the steps after it: the
    step is marked ``settled``, so its new job's ending does not count again. A finished
    workflow stays as it finished (the batches' rule): its step keeps the dead job, whose
    ``requeued_as`` names the new one, and the new job runs on its own. A workflow's
    ``finished_at`` is read here without a lock: one not finished is held by the caller's
    :func:`~sqlqueue._store.batches.settle`, and one finished never changes."""
    if moves:
        workflow = batches.c.id == _steps.c.workflow_id
        run = (select(batches.c.workflow_on_dead).where(workflow).scalar_subquery()) == "run"
        unfinished = select(batches.c.finished_at).where(workflow).scalar_subquery().is_(None)
        conn.execute(
            update(_steps)
            .where(_steps.c.job_id == _bind("old_id"), unfinished)
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
) -> tuple[dict[int, int], list[Released]]:
    """Apply the endings of workflow steps, ``{workflow id: (on_dead, [(job id, status)])}``,
    whose workflow rows the caller holds: release the downstream steps whose upstreams have all
    ended (one set of statements for every workflow of the round, none per step), and, under
    ``on_dead="cancel"``, cancel every step after a dead or cancelled one. Returns how many
    steps were cancelled in each workflow (the caller counts them in its row), and the steps
    released."""
    counted = [
        job_id
        for on_dead, steps in ended.values()
        for job_id, status in steps
        if status == "succeeded" or on_dead == "run"
    ]
    released = release_after(conn, dialect, counted, now) if counted else []
    cancelled: dict[int, int] = {}
    for workflow_id, (on_dead, steps) in ended.items():
        stopped = [job_id for job_id, status in steps if status != "succeeded"]
        if stopped and on_dead == "cancel":
            cancelled[workflow_id] = _cancel_after(conn, dialect, workflow_id, stopped, now)
    return cancelled, released


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
    for chunk in chunks(sorted(seen)):
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
    for chunk in chunks(targets):
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
        for chunk in chunks(gone):
            conn.execute(
                delete(table).where(table.c.workflow_id.in_(chunk)),
                execution_options=dialect.table_options,
            )
