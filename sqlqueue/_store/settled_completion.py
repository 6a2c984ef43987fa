"""A worker round's successes and their batches' counters in one statement, where the backend
has writing CTEs (PostgreSQL).

A round that only completes jobs without results (the common round) and ends children of
batches or steps of workflows sent the fenced completion, then the UPDATE of its batches'
counters (:func:`~sqlqueue._store.batches.settle`): here they are one statement, the second a
CTE fed by the rows the first changed, locking rows in the order the two statements did: the
jobs (in id order, the fence's CTE), then the batch rows (in id order, a locking subquery).
The counters' UPDATE waits for the row versions other transactions commit and adds to the
newest, as the separate statement does.

The release of the workflows' steps after those that ended stays a statement of its own
(:func:`~sqlqueue._store.workflows.advance`), run once this one holds the workflows' rows: a
statement sees the rows committed before it started, and a step that a running step added
(``ctx.add_to_workflow``, which holds the workflow's row) must be seen by the release that
follows the wait for that row, or it would wait for ever.

The batches are found by the ids the worker claimed its jobs with (``batch_ids``: a job's
batch never changes), so each lookup goes by key; the counts come from the rows the
completion changed, so a job whose lease was lost counts nowhere. The statement is built once
per backend."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
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
from sqlalchemy.dialects.postgresql import ARRAY

from sqlqueue._schema import batches
from sqlqueue._store.outcomes import complete_statement
from sqlqueue._store.statement_cache import cached_statement
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


class Completed:
    """What :func:`complete_and_settle` wrote: the job ids that were still ours with their
    batches, and the batch rows it holds (their counters with the round's successes added,
    ``finished_at`` set on those it finished)."""

    __slots__ = ("held", "landed")

    def __init__(self) -> None:
        self.landed: dict[int, int | None] = {}
        self.held: dict[int, dict[str, Any]] = {}


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
    their batches (``batch_ids``: those the jobs were claimed with) and finish the batches
    without a callback that they complete, in one statement (see the module docstring). The
    caller releases the workflows' steps and enqueues the callbacks."""
    params = {
        "worker_id": worker_id,
        "batch_ids": sorted(set(batch_ids)),
        **dialect.fence_parameters(fences),
    }
    if now is None:
        key = ("complete_and_settle", type(dialect))
        stmt = cached_statement(key, lambda: _build(dialect, None))
    else:
        stmt = _build(dialect, now)
    done = Completed()
    for row in conn.execute(stmt, params, execution_options=dialect.table_options).mappings():
        if row["kind"] == "job":
            batch_id = row["batch_id"]
            done.landed[int(row["id"])] = None if batch_id is None else int(batch_id)
        else:
            done.held[int(row["id"])] = {column.name: row[column.name] for column in _HELD}
    return done


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
    no_batch = cast(null(), BigInteger())

    def row(kind: str, row_id: Any, batch_id: Any, source: Any = None) -> Any:
        """One kind of the statement's rows, the columns of the other NULL."""
        return select(
            literal(kind, String()).label("kind"),
            row_id.label("id"),
            batch_id.label("batch_id"),
            *(
                (cast(null(), c.type) if source is None else source.c[c.name]).label(c.name)
                for c in _HELD[1:]
            ),
        )

    return union_all(
        row("job", completed.c.id, completed.c.batch_id),
        row("batch", held.c.id, no_batch, held),
    )
