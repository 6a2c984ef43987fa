"""A worker round's successes, their batches' counters and their workflows' releases in one
statement, where the backend has writing CTEs (PostgreSQL).

A round that only completes jobs without results (the common round) and ends children of
batches or steps of workflows sent the fenced completion, the UPDATE of its batches' counters
(:func:`~sqlqueue._store.batches.settle`) and the release of the steps after those that ended
(:func:`~sqlqueue._store.workflow_release.release_after`). Here they are CTEs of one
statement, each fed by the rows the one before changed, locking rows in the order the
statements did: the jobs (in id order, the fence's CTE), the batch rows (in id order, a
locking subquery), the step rows lowered, the jobs released. Each UPDATE waits for the row
versions other transactions commit and computes from the newest, so of two rounds ending a
diamond's two upstream steps exactly one releases its join.

One thing a single statement cannot see: rows committed after it started. A running step that
adds a step (``ctx.add_to_workflow``) holds the workflow's row while it inserts the step and
its edges and adds one to the workflow's ``total``; a round that waited for that row would
lower counts along the edges it saw before the wait, and the new step would wait for ever. So
the statement also reads each workflow's ``total`` as it saw it: a workflow whose row it then
holds with another total (a step was added during the wait) is left out of the release here,
and :func:`complete_and_settle` returns it for the caller to release with a statement of its
own, which sees the new edges. No other transaction adds edges to a running workflow, and
``total`` only grows.

The batches are found by the ids the worker claimed its jobs with (``batch_ids``: a job's
batch never changes), so each lookup goes by key; the counts come from the rows the
completion changed, so a job whose lease was lost counts nowhere. The statement is built once
per backend and wake-up channel."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any
from weakref import WeakKeyDictionary

from sqlalchemy import (
    ARRAY,
    BigInteger,
    Boolean,
    Connection,
    String,
    bindparam,
    case,
    cast,
    func,
    literal,
    null,
    select,
    union_all,
    update,
)
from sqlalchemy.engine import Dialect as SADialect
from sqlalchemy.types import TypeEngine

from sqlqueue._schema import batches, jobs
from sqlqueue._store._direct import DirectStatement, can_run_directly
from sqlqueue._store.claim_floor import Released
from sqlqueue._store.outcomes import complete_statement
from sqlqueue._store.statement_cache import cached_statement
from sqlqueue._store.workflow_release import lowered_steps, release_statement
from sqlqueue.dialects import Dialect

__all__ = ["Completed", "complete_and_settle"]

#: What the statement returns of each batch row it holds (as ``settle`` reads them).
_HELD = (
    batches.c.id,
    batches.c.total,
    batches.c.succeeded,
    batches.c.dead,
    batches.c.cancelled,
    batches.c.on_complete,
    batches.c.on_dead,
    batches.c.workflow_on_dead,
    batches.c.finished_at,
)
_HELD_NAMES = tuple(column.name for column in _HELD)
#: The statement's columns after ``kind`` and ``id``, each NULL in the rows of the kinds that
#: have no value for it, in the order the rows are read back by place.
_PADDED: tuple[tuple[str, TypeEngine[Any]], ...] = (
    ("batch_id", BigInteger()),
    ("queue", String()),
    ("job_type", String()),
    ("priority", jobs.c.priority.type),
    ("due", jobs.c.next_run_at.type),
    ("grew", Boolean()),
    *((column.name, column.type) for column in _HELD[1:]),
)
_AT = {name: place for place, name in enumerate(("kind", "id", *(n for n, _ in _PADDED)))}
_BATCH_ID, _QUEUE, _JOB_TYPE, _PRIORITY, _DUE, _GREW = (
    _AT[name] for name in ("batch_id", "queue", "job_type", "priority", "due", "grew")
)
#: Each column of ``_HELD`` with its place.
_HELD_PLACES = tuple((name, _AT[name]) for name in _HELD_NAMES)


class Completed:
    """What :func:`complete_and_settle` wrote: the job ids that were still ours with their
    batches; of the batch rows it holds (their counters with the round's successes added),
    those left for the caller: completed with a callback to enqueue, or grown; the steps it
    released (with where they sort in claim order); and the workflows that grew while it
    waited for their rows, whose steps after those that ended it did not release (the caller
    does)."""

    __slots__ = ("grew", "held", "landed", "released")

    def __init__(self) -> None:
        self.landed: dict[int, int | None] = {}
        self.held: dict[int, dict[str, Any]] = {}
        self.released: list[Released] = []
        self.grew: set[int] = set()


def complete_and_settle(
    conn: Connection,
    dialect: Dialect,
    *,
    worker_id: str,
    fences: Sequence[tuple[int, int]],
    batch_ids: Sequence[int],
    now: datetime | None = None,
) -> Completed:
    """Mark the leased jobs ``fences`` ``succeeded`` (no results), add them to the counters of
    their batches (``batch_ids``: those the jobs were claimed with), finish the batches
    without a callback that they complete, and release the steps left with nothing to wait
    for, in one statement (see the module docstring). The caller releases the steps of the
    workflows that grew meanwhile and enqueues the callbacks."""
    params = {
        "worker_id": worker_id,
        "batch_ids": sorted(set(batch_ids)),
        **dialect.fence_parameters(fences),
    }
    convert: Callable[[int, Any], Any] = _as_returned
    rows: Sequence[Any]
    if now is None:
        key = ("complete_and_settle", type(dialect), dialect.wake_channel)
        stmt = cached_statement(key, lambda: _build(dialect, None))
        if can_run_directly(conn):
            # Straight to the driver: SQLAlchemy would hash the statement's cache key (some
            # 3,000 elements, against some 500 for a plain completion) at every execution to
            # find the compiled form (see ``_direct.py``).
            direct = cached_statement((*key, "direct"), lambda: DirectStatement(stmt, params))
            rows = direct.all_rows(conn, params, dialect.schema)
            convert = _converter(conn.dialect)
        else:
            rows = conn.execute(stmt, params, execution_options=dialect.table_options).all()
    else:
        stmt = _build(dialect, now)
        rows = conn.execute(stmt, params, execution_options=dialect.table_options).all()
    done = Completed()
    # Tuples, read by place (``_AT``: the order ``_build`` selects in).
    for row in rows:
        kind, row_id = row[0], int(row[1])
        if kind == "job":
            batch_id = row[_BATCH_ID]
            done.landed[row_id] = None if batch_id is None else int(batch_id)
        elif kind == "batch":
            done.held[row_id] = {name: convert(at, row[at]) for name, at in _HELD_PLACES}
            if row[_GREW]:
                done.grew.add(row_id)
        else:
            done.released.append(
                Released(
                    job_id=row_id, queue=str(row[_QUEUE]), job_type=str(row[_JOB_TYPE]),
                    priority=int(row[_PRIORITY]), due=convert(_DUE, row[_DUE]),
                )
            )  # fmt: skip
    return done


def _as_returned(place: int, value: Any) -> Any:
    """A value of a row SQLAlchemy read (its types' result processing done)."""
    return value


#: Per SQLAlchemy dialect: the result processing of the columns that have one, by place.
_PROCESSORS: WeakKeyDictionary[SADialect, dict[int, Callable[[Any], Any]]] = WeakKeyDictionary()


def _converter(dialect: SADialect) -> Callable[[int, Any], Any]:
    """What SQLAlchemy's result processing would do to a driver's value at each place (the
    columns' types: timestamps in UTC, JSON documents), for rows read by ``DirectStatement``."""
    processors = _PROCESSORS.get(dialect)
    if processors is None:
        processors = {}
        for name, type_ in _PADDED:
            process = type_.dialect_impl(dialect).result_processor(dialect, None)
            if process is not None:
                processors[_AT[name]] = process
        _PROCESSORS[dialect] = processors
    found = processors

    def convert(place: int, value: Any) -> Any:
        process = found.get(place)
        return value if process is None or value is None else process(value)

    return convert


def _build(dialect: Dialect, now: datetime | None) -> Any:
    current = dialect.now(now)
    completed = complete_statement(dialect, now, with_result=False).cte("sqlqueue_done")
    counts = (
        select(completed.c.batch_id, func.count().label("ended"))
        .where(completed.c.batch_id.is_not(None))
        .group_by(completed.c.batch_id)
        .cte("sqlqueue_counts")
    )
    hinted = bindparam("batch_ids", type_=ARRAY(BigInteger()))
    # Each batch's total as this statement's snapshot has it (a plain read: no wait).
    seen = (
        select(batches.c.id, batches.c.total)
        .where(batches.c.id == func.any(hinted))
        .cte("sqlqueue_seen")
    )
    ordered = dialect.lock_row(
        select(batches.c.id)
        .where(batches.c.id == func.any(hinted), batches.c.finished_at.is_(None))
        .order_by(batches.c.id)
    )
    added = batches.c.succeeded + counts.c.ended
    complete = (added + batches.c.dead + batches.c.cancelled >= batches.c.total) & (
        batches.c.on_complete.is_(None) & batches.c.on_dead.is_(None)
    )
    held = (
        update(batches)
        .where(
            batches.c.id == func.any(hinted),  # by the key
            batches.c.id == counts.c.batch_id,
            batches.c.id.in_(ordered.scalar_subquery()),
            batches.c.finished_at.is_(None),
        )
        .values(succeeded=added, finished_at=case((complete, current), else_=None))
        .returning(*_HELD)
        .cte("sqlqueue_held")
    )
    # ``total`` of the newest version, which the UPDATE returns, against the snapshot's.
    # IS DISTINCT FROM: a row the snapshot lacked counts as grown, the safe side (never NULL).
    grew = held.c.total.is_distinct_from(
        select(seen.c.total).where(seen.c.id == held.c.id).scalar_subquery()
    )
    # The workflows that go on (one this round finished has no step waiting: a chain's end),
    # and to which no step was added while this statement waited for their rows.
    going_on = select(held.c.id).where(
        held.c.workflow_on_dead.is_not(None), held.c.finished_at.is_(None), ~grew
    )
    ids = bindparam("fence_ids", type_=ARRAY(BigInteger()))
    lowered = lowered_steps(
        lambda upstream: [
            upstream.c.job_id == func.any(ids),  # by the key
            upstream.c.job_id.in_(select(completed.c.id)),
            # ``+ 0``: no index serves it, so the planner cannot read every step of a big
            # workflow by the primary key's first column (a 3,000-step fan-out: 3,000 rows a
            # round); the steps are found by their jobs' ids, by the unique key.
            (upstream.c.workflow_id + 0).in_(going_on),
        ]
    )
    released = release_statement(dialect, now, lowered).cte("sqlqueue_released")

    def row(kind: str, row_id: Any, **given: Any) -> Any:
        """One kind of the statement's rows; the columns of the others NULL."""
        return select(
            literal(kind, String()).label("kind"),
            row_id.label("id"),
            *(given.get(name, cast(null(), type_)).label(name) for name, type_ in _PADDED),
        )

    # The batch rows the caller has something to do with: those that grew (their steps are
    # released by a statement of its own), and those the round completed that have a callback
    # to enqueue (the UPDATE finished the others). A workflow going on, or one it finished, is
    # not sent back: a chain's rounds return no batch row.
    ended = held.c.succeeded + held.c.dead + held.c.cancelled >= held.c.total
    return union_all(
        row("job", completed.c.id, batch_id=completed.c.batch_id),
        row("batch", held.c.id, grew=grew, **{c.name: held.c[c.name] for c in _HELD[1:]}).where(
            grew | (held.c.finished_at.is_(None) & ended)
        ),
        row(
            "released",
            released.c.id,
            queue=released.c.queue,
            job_type=released.c.job_type,
            priority=released.c.priority,
            due=released.c.next_run_at,
        ),
    )
