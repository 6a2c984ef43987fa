"""Batches: their rows, the children's endings counted, and the callback enqueued exactly once.

Every transition that ends a child (success, dead, cancel; by a worker, the reaper or an
operator) notes it in :class:`Endings`, and the same transaction then calls :func:`settle`: one
locking read takes every batch row of the round (in id order) with its counts, and one UPDATE
per distinct change (in a worker's round, "one more success" for most) adds the endings to the
counters and marks the finished batches; no statement per batch. The read holds the batches'
rows (PostgreSQL and MariaDB row locks; SQLite's one writer) until the transaction ends, so of
two children finishing at the same moment one waits for the other's commit and then reads the
counts it wrote: exactly one transaction sees the counts reach ``total``, and it inserts the
callback job and sets ``finished_at``. A finished batch's row is read by no further settle.

Jobs without a batch never reach this module: their transitions return ``batch_id`` NULL and
:func:`settle` with no endings sends nothing.

Lock order. Every path that ends or changes a child (a worker's round, transactional
completion, the reaper giving up, expiry, cancel of one job or by filter, requeue and discard
of a dead one) meets here, and all of them take rows in one order, so no two wait on each
other crosswise:

1. the counts' mark, for an operator's action on dead jobs (requeue, discard);
2. the rows of the jobs it ends or changes that are not ``waiting`` — running (a worker's
   fenced write, the reaper), queued or failed (a claim, expiry, a cancel), dead (a requeue) —
   in id order where there are several;
3. the batch and workflow rows, in id order (:func:`settle`, :func:`hold_batches`);
4. a workflow's step rows, then the rows of its ``waiting`` steps: the release of those whose
   upstreams have all ended, the ``on_dead="cancel"`` cascade, and an operator's cancel of a
   waiting step (:mod:`~sqlqueue._store.cancel`, :func:`job_actions.cancel_batch`).

On InnoDB a statement locks a row as its entries in the indexes it goes through. The locking
read of a write that names its rows' ids (every fenced transition, the heartbeat) goes by the
primary key, the row before any other entry of it, as a write of the row does (``_by_key``
in ``sqlqueue/dialects/_mysql_returning.py``): a heartbeat that took its jobs' rows through
the status index held the entry a completion of one of them had to change while it waited for
that row, and InnoDB aborted the completion.

A step leaves ``waiting`` only under its workflow's row, so a transaction holding that row
knows which of its job rows are in the last class. A transaction holding batch rows waits for
no job row outside that class: where it may meet one (a filtered cancel's steps released
while it waited for their workflows) it takes it with ``SKIP LOCKED``, never waiting for it.
One exception: a cancel of one waiting step that its workflow releases while the cancel waits
for the workflow's row then waits for the step's row, which a worker holds only if it claimed,
ran and finished the step in that moment (its round holds the step's row and asks for the
workflow's). The server then aborts one of the two. On PostgreSQL the one that started waiting
first runs the deadlock check (after ``deadlock_timeout``, 1 s by default) and is aborted
(40P01); InnoDB picks its victim itself. Neither way loses anything. An aborted worker round
rolls back whole: its outcomes go back to the worker, which writes them again in their own
transaction tens of milliseconds later (``sqlqueue/_worker/outbox.py``), its lease still held,
so the step succeeds once and does not run again; the cancel, which then gets the step's row,
finds it running and only asks its handler to stop. An aborted cancel writes nothing: on
PostgreSQL :meth:`Queue.cancel` raises :class:`DatabaseError` (the caller may ask again, and
then learns the step ran); on MariaDB the dialect runs the cancel's transaction again.

Retention prunes a finished batch's row with the last job that refers to it (children and
callback): the counters live on the batch row, so pruning children never changes its counts,
and no batch row outlives its jobs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import (
    Connection,
    Integer,
    RowMapping,
    bindparam,
    case,
    delete,
    func,
    insert,
    null,
    select,
    update,
)

from sqlqueue._batch import BatchStatus
from sqlqueue._job import JobStatus
from sqlqueue._jobrow import JobRow
from sqlqueue._schema import batches, jobs
from sqlqueue._store.batch_callbacks import enqueue_callback, request_document
from sqlqueue._store.claim_floor import Released
from sqlqueue._store.inserts import insert_rows
from sqlqueue._store.statement_cache import cached_statement
from sqlqueue._store.workflows import advance, forget_steps
from sqlqueue.dialects import Dialect

__all__ = [
    "Endings",
    "Settled",
    "create_batch",
    "forget_finished",
    "hold_batches",
    "insert_children",
    "read_batch",
    "read_batches",
    "refuse_children",
    "settle",
    "settle_completed",
    "settle_held",
]

#: The terminal statuses a batch counts, each in the column of the same name.
_COUNTED = ("succeeded", "dead", "cancelled")
#: The counters :func:`settle` adds to, in the order of its changes' tuples.
_COUNTERS = (batches.c.total, batches.c.succeeded, batches.c.dead, batches.c.cancelled)
#: What :func:`settle` reads of each batch row it holds.
_HELD = (
    batches.c.id,
    *_COUNTERS,
    batches.c.on_complete,
    batches.c.on_dead,
    batches.c.workflow_on_dead,
)
#: The statuses of children still on their way, counted from the jobs table when read.
_LIVE = ("queued", "running", "failed", "waiting")


class Endings:
    """Children that ended in one transaction (and children added by a finishing parent), by
    batch: what :func:`settle` adds to the batches' counters."""

    def __init__(self) -> None:
        self._by_batch: dict[int, dict[str, int]] = {}
        self._jobs: dict[int, list[tuple[int, str]]] = {}

    def ended(
        self, batch_id: int | None, status: str, count: int = 1, *, job_id: int | None = None
    ) -> None:
        """``count`` children of ``batch_id`` reached terminal ``status`` (``None``: no batch,
        nothing to note). A negative count takes endings back (a dead child requeued).
        ``job_id``: the child that ended, which a workflow's steps after it wait for."""
        if batch_id is not None and status in _COUNTED:
            counts = self._by_batch.setdefault(int(batch_id), {})
            counts[status] = counts.get(status, 0) + count
            if job_id is not None and count > 0:
                self._jobs.setdefault(int(batch_id), []).append((int(job_id), status))

    def jobs(self, batch_id: int) -> list[tuple[int, str]]:
        """``(job id, status)`` of the children of ``batch_id`` noted with their id."""
        return self._jobs.get(batch_id, [])

    def grew(self, batch_id: int, count: int) -> None:
        """A finishing parent added ``count`` children to ``batch_id``."""
        if count:
            counts = self._by_batch.setdefault(int(batch_id), {})
            counts["total"] = counts.get("total", 0) + count

    def __bool__(self) -> bool:
        return bool(self._by_batch)

    def items(self) -> list[tuple[int, dict[str, int]]]:
        """``(batch id, counts)`` in batch id order: the order batch rows are locked in, so
        two transactions never wait on each other's batches crosswise."""
        return sorted(self._by_batch.items())


@dataclass(frozen=True)
class Settled:
    """What :func:`settle` made claimable: the callback jobs it enqueued, and the queues of
    those and of the workflow steps it released. False when it made nothing claimable, so a
    worker wakes its pools only when there is something new for them. ``released``: the steps
    (where they sort in claim order: the worker's claim floors go down to them)."""

    callbacks: list[int] = field(default_factory=list)
    queues: frozenset[str] = frozenset()
    released: tuple[Released, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.queues)


# -- writing a batch ----------------------------------------------------------------------------


def create_batch(
    conn: Connection,
    dialect: Dialect,
    *,
    children: Sequence[JobRow],
    on_complete: JobRow | None,
    on_dead: JobRow | None,
    workflow_on_dead: str | None = None,
) -> tuple[int, list[int]]:
    """Write a batch row and its ``children`` on ``conn`` (the caller's transaction); return the
    batch id and the children's ids. An empty batch is finished at once: its callback is
    enqueued in the same transaction. ``workflow_on_dead`` makes it a workflow's row (its
    children are the steps, see :mod:`sqlqueue._store.workflows`)."""
    complete_document = request_document(on_complete)
    stmt = (
        insert(batches)
        .values(
            total=len(children),
            succeeded=0,
            dead=0,
            cancelled=0,
            # SQL NULL, not JSON null, where there is no callback.
            on_complete=null() if complete_document is None else complete_document,
            on_dead=null() if on_dead is None else request_document(on_dead),
            created_at=dialect.now(),
            workflow_on_dead=workflow_on_dead,
        )
        .returning(batches.c.id)
    )
    result = dialect.execute_returning(conn, stmt, execution_options=dialect.table_options)
    batch_id = int(result.scalar_one())
    if not children:
        _finish(conn, dialect, batch_id, dead=0, on_complete=complete_document, on_dead=None)
        return batch_id, []
    return batch_id, insert_children(conn, dialect, batch_id, children)


def insert_children(
    conn: Connection, dialect: Dialect, batch_id: int, rows: Sequence[JobRow]
) -> list[int]:
    """Insert checked ``rows`` (without idempotency keys) as children of ``batch_id``."""
    if not rows:
        return []
    return insert_rows(dialect, conn, [{**row, "batch_id": batch_id} for row in rows])


def refuse_children(
    conn: Connection, dialect: Dialect, batch_id: int
) -> Literal["finished", "workflow"] | None:
    """Why children cannot be added to ``batch_id`` now: ``"workflow"`` (it is a workflow's
    row, whose jobs are steps: a child without a step row would be counted but never shown),
    ``"finished"`` (it has finished, or is gone); ``None`` when they can be."""
    query = select(batches.c.finished_at, batches.c.workflow_on_dead).where(
        batches.c.id == batch_id
    )
    row = conn.execute(query, execution_options=dialect.table_options).first()
    if row is not None and row[1] is not None:
        return "workflow"
    return "finished" if row is None or row[0] is not None else None


# -- counting endings ---------------------------------------------------------------------------


def settle(
    conn: Connection, dialect: Dialect, endings: Endings, now: datetime | None = None
) -> Settled:
    """Add ``endings`` to their batches' counters in ``conn``'s transaction; for each batch
    whose children have now all ended, enqueue its callback and mark it finished. Returns what
    it made claimable (:class:`Settled`). Sends nothing when ``endings`` is empty.

    A constant number of statements for any number of batches: one locking read of every
    batch row (in id order), the workflows' releases (:func:`advance`), and one UPDATE per
    distinct change (most endings of a round add one success: one UPDATE), plus one INSERT
    per callback enqueued."""
    items = endings.items()
    if not items:
        return Settled()
    deltas = {batch_id: _delta(counts) for batch_id, counts in items}
    if len(set(deltas.values())) == 1 and not dialect.emulates_returning:
        return _settle_alike(conn, dialect, endings, next(iter(deltas.values())), now)
    held = _lock_batches(conn, dialect, [batch_id for batch_id, _ in items])
    # Workflows among them that go on: release the steps after those that ended, all at once,
    # while this transaction holds their rows. One whose steps have now all ended has none
    # waiting (a chain's last step): no statement for it.
    steps = {
        batch_id: (str(row["workflow_on_dead"]), endings.jobs(batch_id))
        for batch_id, row in held.items()
        if row["workflow_on_dead"] is not None and not _all_ended(row, deltas[batch_id])
    }
    cancelled_steps, released = advance(conn, dialect, steps, now) if steps else ({}, [])
    enqueued: list[tuple[int, str]] = []
    changes: dict[tuple[int, int, int, int], list[int]] = {}
    finished: list[int] = []
    for batch_id, counts in items:
        row = held.get(batch_id)
        if row is None:  # finished already: a late ending (a requeued child, the callback)
            continue
        delta = (
            counts.get("total", 0),
            counts.get("succeeded", 0),
            counts.get("dead", 0),
            counts.get("cancelled", 0) + cancelled_steps.get(batch_id, 0),
        )
        changes.setdefault(delta, []).append(batch_id)
        dead = row["dead"] + delta[2]
        ended = row["succeeded"] + delta[1] + dead + row["cancelled"] + delta[3]
        if ended < row["total"] + delta[0]:
            continue
        callback = enqueue_callback(
            conn, dialect, batch_id, dead=dead, on_complete=row["on_complete"],
            on_dead=row["on_dead"],
        )  # fmt: skip
        if callback is None:
            finished.append(batch_id)
            continue
        enqueued.append(callback)
        conn.execute(
            update(batches)
            .where(batches.c.id == batch_id)
            .values(finished_at=dialect.now(now), callback_job_id=callback[0]),
            execution_options=dialect.table_options,
        )
    current = dialect.now(now)
    for delta, batch_ids in changes.items():
        values: dict[str, Any] = {
            column.name: column + added
            for column, added in zip(_COUNTERS, delta, strict=True)
            if added
        }
        ending = [batch_id for batch_id in batch_ids if batch_id in finished]
        if ending:  # those without a callback finish in the same statement
            values["finished_at"] = case(
                (batches.c.id.in_(ending), current), else_=batches.c.finished_at
            )
        if values:
            conn.execute(
                update(batches).where(batches.c.id.in_(batch_ids)).values(**values),
                execution_options=dialect.table_options,
            )
    return _settled(enqueued, released)


def _settled(enqueued: list[tuple[int, str]], released: list[Released]) -> Settled:
    return Settled(
        callbacks=[job_id for job_id, _ in enqueued],
        queues=frozenset([*(queue for _, queue in enqueued), *(step.queue for step in released)]),
        released=tuple(released),
    )


def _all_ended(row: RowMapping, delta: tuple[int, int, int, int]) -> bool:
    """Whether the children of held batch ``row`` have all ended once ``delta`` is added."""
    total, succeeded, dead, cancelled = (
        int(row[column.name]) + added for column, added in zip(_COUNTERS, delta, strict=True)
    )
    return succeeded + dead + cancelled >= total


def _delta(counts: Mapping[str, int]) -> tuple[int, int, int, int]:
    """What ``counts`` add to the counters of :data:`_COUNTERS`, in their order."""
    return tuple(counts.get(column.name, 0) for column in _COUNTERS)  # type: ignore[return-value]


def _settle_alike(
    conn: Connection,
    dialect: Dialect,
    endings: Endings,
    delta: tuple[int, int, int, int],
    now: datetime | None,
) -> Settled:
    """:func:`settle` where every batch gets the same ``delta`` (a worker's round: one more
    success each) and ``UPDATE … RETURNING`` is native: one UPDATE (built once, see
    :func:`_add_to_held`) locks the rows in id order
    (its subquery's ``FOR UPDATE``, so two rounds never wait crosswise), adds ``delta``, finishes
    the batches without a callback that it completes, and returns the rows. Only a callback,
    or steps a workflow cancels, cost more (per batch). SET expressions read the old row here
    (PostgreSQL, SQLite), which the CASE relies on."""
    batch_ids = [batch_id for batch_id, _ in endings.items()]
    added = {f"add_{column.name}": n for column, n in zip(_COUNTERS, delta, strict=True)}
    params = {"ids": batch_ids, **added}
    options = dialect.table_options
    held = {
        int(row["id"]): row
        for row in conn.execute(
            _add_to_held(dialect, now), params, execution_options=options
        ).mappings()
    }
    # The workflows that go on (one whose steps have all ended has none waiting: a chain's
    # last step costs no statement).
    steps = {
        batch_id: (str(row["workflow_on_dead"]), endings.jobs(batch_id))
        for batch_id, row in held.items()
        if row["workflow_on_dead"] is not None and row["finished_at"] is None
    }
    cancelled_steps, released = advance(conn, dialect, steps, now) if steps else ({}, [])
    return settle_held(conn, dialect, held, cancelled_steps, released, now)


def settle_completed(
    conn: Connection,
    dialect: Dialect,
    landed: Mapping[int, int | None],
    held: Mapping[int, Mapping[str, Any]],
    released: list[Released],
    grew: Set[int],
    now: datetime | None = None,
) -> Settled:
    """:func:`settle` of a round of successes whose statement already added them to the
    ``held`` batch rows and ``released`` the steps after them (``landed``: each completed
    job's batch; see ``settled_completion.py``): release the steps after them in the
    workflows that ``grew`` while the statement waited for their rows, in a statement of its
    own that sees the steps added, and enqueue the callbacks."""
    if not held:  # the common round: the statement finished or left every batch
        return _settled([], released)
    ended: dict[int, list[tuple[int, str]]] = {}
    for job_id, batch_id in landed.items():
        if batch_id is not None:
            ended.setdefault(batch_id, []).append((job_id, "succeeded"))
    steps = {
        batch_id: (str(row["workflow_on_dead"]), ended.get(batch_id, []))
        for batch_id, row in held.items()
        if batch_id in grew and row["workflow_on_dead"] is not None and row["finished_at"] is None
    }
    cancelled_steps, more = advance(conn, dialect, steps, now) if steps else ({}, [])
    return settle_held(conn, dialect, held, cancelled_steps, [*released, *more], now)


def settle_held(
    conn: Connection,
    dialect: Dialect,
    held: Mapping[int, Mapping[str, Any]] | Mapping[int, RowMapping],
    cancelled_steps: Mapping[int, int],
    released: list[Released],
    now: datetime | None = None,
) -> Settled:
    """The rest of a settle whose one UPDATE added the round's endings to the ``held`` batch
    rows (their counters as it left them, ``finished_at`` set on those it finished): count the
    steps a workflow cancelled, and enqueue the callback of each batch the round completed.
    One UPDATE per batch that needs one, none for the others."""
    current = dialect.now(now)
    enqueued: list[tuple[int, str]] = []
    for batch_id, row in held.items():
        more = cancelled_steps.get(batch_id, 0)
        if row["finished_at"] is not None:
            continue  # finished by the UPDATE: nothing was left to cancel
        ended = row["succeeded"] + row["dead"] + row["cancelled"] + more
        finished = ended >= row["total"]
        if not (more or finished):
            continue
        later: dict[str, Any] = {"cancelled": batches.c.cancelled + more} if more else {}
        if finished:
            callback = enqueue_callback(
                conn, dialect, batch_id, dead=row["dead"], on_complete=row["on_complete"],
                on_dead=row["on_dead"],
            )  # fmt: skip
            later.update(finished_at=current, callback_job_id=callback and callback[0])
            if callback is not None:
                enqueued.append(callback)
        conn.execute(
            update(batches).where(batches.c.id == batch_id).values(**later),
            execution_options=dialect.table_options,
        )
    return _settled(enqueued, released)


def _add_to_held(dialect: Dialect, now: datetime | None) -> Any:
    """:func:`_settle_alike`'s UPDATE of batches ``:ids``, adding ``:add_<counter>`` to each
    counter: built once per backend (building it cost more CPU than running it)."""
    if now is None:
        return cached_statement(("settle_alike", type(dialect)), lambda: _build_add(dialect, None))
    return _build_add(dialect, now)


def _build_add(dialect: Dialect, now: datetime | None) -> Any:
    current = dialect.now(now)
    ids = bindparam("ids", expanding=True, type_=batches.c.id.type)
    total, succeeded, dead, cancelled = added = [
        column + bindparam(f"add_{column.name}", type_=Integer()) for column in _COUNTERS
    ]
    values: dict[str, Any] = {
        column.name: value for column, value in zip(_COUNTERS, added, strict=True)
    }
    complete = (succeeded + dead + cancelled >= total) & batches.c.on_complete.is_(None)
    values["finished_at"] = case((complete & batches.c.on_dead.is_(None), current), else_=None)
    ordered = dialect.lock_row(
        select(batches.c.id)
        .where(batches.c.id.in_(ids), batches.c.finished_at.is_(None))
        .order_by(batches.c.id)
    )
    return (
        update(batches)
        .where(
            batches.c.id.in_(ids),  # by the key, not a scan joined to the subquery
            batches.c.id.in_(ordered.scalar_subquery()),
            batches.c.finished_at.is_(None),
        )
        .values(**values)
        .returning(*_HELD, batches.c.finished_at)
    )


def hold_batches(conn: Connection, dialect: Dialect, batch_ids: Iterable[int]) -> None:
    """Lock the unfinished rows among ``batch_ids`` (in id order) before the rows of waiting
    steps a transaction changes; its :func:`settle` then finds them held (see the lock order
    above)."""
    ids = sorted(set(batch_ids))
    if ids and dialect.supports_row_locks:
        _lock_batches(conn, dialect, ids)


def _lock_batches(
    conn: Connection, dialect: Dialect, batch_ids: list[int]
) -> dict[int, RowMapping]:
    """The unfinished rows among ``batch_ids``, locked until the transaction ends, in id order
    so two transactions never wait on each other's batches crosswise. Of two children
    finishing at the same moment, one waits here for the other's commit and then reads the
    counts it wrote (a locking read sees the latest commit, on MariaDB too)."""
    query = (
        select(*_HELD)
        .where(batches.c.id.in_(batch_ids), batches.c.finished_at.is_(None))
        .order_by(batches.c.id)
    )
    rows = conn.execute(dialect.lock_row(query), execution_options=dialect.table_options)
    return {int(row["id"]): row for row in rows.mappings()}


def _finish(
    conn: Connection,
    dialect: Dialect,
    batch_id: int,
    *,
    dead: int,
    on_complete: Mapping[str, Any] | None,
    on_dead: Mapping[str, Any] | None,
    now: datetime | None = None,
) -> int | None:
    """Enqueue the batch's callback (see :func:`enqueue_callback`) and mark the batch
    finished; the caller holds the batch's row."""
    callback = enqueue_callback(
        conn, dialect, batch_id, dead=dead, on_complete=on_complete, on_dead=on_dead
    )
    callback_id = None if callback is None else callback[0]
    conn.execute(
        update(batches)
        .where(batches.c.id == batch_id)
        .values(finished_at=dialect.now(now), callback_job_id=callback_id),
        execution_options=dialect.table_options,
    )
    return callback_id


# -- retention ----------------------------------------------------------------------------------


def forget_finished(conn: Connection, dialect: Dialect, batch_ids: Iterable[int | None]) -> int:
    """Delete the rows of the finished batches among ``batch_ids`` that no job refers to any
    more (retention has pruned their children and callback); return how many went. A batch
    still running, or with a job left, stays."""
    ids = sorted({int(batch_id) for batch_id in batch_ids if batch_id is not None})
    if not ids:
        return 0
    referenced = select(jobs.c.id).where(jobs.c.batch_id == batches.c.id).exists()
    stmt = delete(batches).where(
        batches.c.id.in_(ids), batches.c.finished_at.is_not(None), ~referenced
    )
    gone = int(conn.execute(stmt, execution_options=dialect.table_options).rowcount)
    if gone:
        forget_steps(conn, dialect, ids)
    return gone


# -- reading ------------------------------------------------------------------------------------


def _live_count(status: str) -> Any:
    return (
        select(func.count())
        .select_from(jobs)
        .where(jobs.c.batch_id == batches.c.id, jobs.c.status == status)
        .scalar_subquery()
        .label(status)
    )


def read_batch(conn: Connection, batch_id: int) -> BatchStatus | None:
    """Batch ``batch_id`` with its counts, read in one statement (one snapshot), or ``None``."""
    query = select(batches, *(_live_count(status) for status in _LIVE)).where(
        batches.c.id == batch_id
    )
    row = conn.execute(query).mappings().first()
    return _status(row) if row is not None else None


def read_batches(conn: Connection, *, limit: int, before_id: int | None) -> list[BatchStatus]:
    """The newest ``limit`` batches with ids below ``before_id``, each with its counts."""
    query = (
        select(batches, *(_live_count(status) for status in _LIVE))
        .order_by(batches.c.id.desc())
        .limit(limit)
    )
    if before_id is not None:
        query = query.where(batches.c.id < before_id)
    query = query.where(batches.c.workflow_on_dead.is_(None))  # workflows are listed apart
    return [_status(row) for row in conn.execute(query).mappings()]


def _status(row: RowMapping) -> BatchStatus:
    finished = row["finished_at"] is not None
    counts = {JobStatus(status): int(row[status]) for status in _COUNTED}
    for status in _LIVE:  # a finished batch's counts are final
        counts[JobStatus(status)] = 0 if finished else int(row[status])
    return BatchStatus(
        id=int(row["id"]),
        total=int(row["total"]),
        counts={status: counts[status] for status in JobStatus},
        created_at=row["created_at"],
        finished_at=row["finished_at"],
        callback_job_id=row["callback_job_id"],
    )
