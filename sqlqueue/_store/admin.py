"""The operators' side of the store: the read model and the dead-letter, retention and pause
actions, each in short transactions with driver errors translated (see ``Store`` for the
worker's side)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, column, select, table

from sqlqueue._batch import BatchStatus
from sqlqueue._errors import SchemaNotMigrated
from sqlqueue._job import Job
from sqlqueue._job_action import JobAction
from sqlqueue._schema import VERSION_TABLE
from sqlqueue._store import (
    aging,
    batches,
    counts,
    deadletter,
    due,
    expiry,
    history,
    job_actions,
    maintenance,
    readmodel,
    unique_prune,
    workers,
)
from sqlqueue._store.filters import JobFilter
from sqlqueue._store.job_actions import CancelBatch, Record
from sqlqueue._store.readmodel import ActivityRows, StatsRows
from sqlqueue._store.transactions import in_read, in_write
from sqlqueue._store.workers import LiveWorker, OverdueType, SeenWorker
from sqlqueue._store.workflow_list import read_workflow_summaries
from sqlqueue._worker_info import WorkerInfo
from sqlqueue._workflow_summary import WorkflowSummary
from sqlqueue.dialects import Dialect

__all__ = ["Admin"]

T = TypeVar("T")


class Admin:
    """Operator queries and actions on one engine; each call is one short transaction."""

    def __init__(self, engine: Engine, dialect: Dialect) -> None:
        self.engine = engine
        self.dialect = dialect

    def _read(self, operation: Callable[[Connection], T]) -> T:
        """``operation`` in one short transaction, ended with a COMMIT (see :func:`in_read`)."""
        return in_read(self.engine, self.dialect, operation)

    def _snapshot(self, operation: Callable[[Connection], T]) -> T:
        """``operation`` in one read-only transaction that sees one snapshot throughout."""

        def run(conn: Connection) -> T:
            self.dialect.begin_snapshot(conn)
            return operation(conn)

        return in_read(self.engine, self.dialect, run)

    def _write(self, operation: Callable[[Connection], T]) -> T:
        return in_write(self.engine, self.dialect, operation)

    def _with_mark(self, operation: Callable[[Connection], T], *, relaxed: bool = False) -> T:
        """Run ``operation``, which locks the finished-job counts' mark; when there is no mark
        yet, create it in a transaction of its own first (see :func:`counts.create_mark`).
        ``relaxed``: see :func:`in_write`."""
        try:
            return in_write(self.engine, self.dialect, operation, relaxed=relaxed)
        except counts.MarkMissing:
            self._write(lambda conn: counts.create_mark(conn, self.dialect))
            return in_write(self.engine, self.dialect, operation, relaxed=relaxed)

    # -- reading -------------------------------------------------------------------------------

    def schema_revision(self) -> str | None:
        """The sqlqueue schema revision the database is at (``None``: never migrated)."""

        schema = self.dialect.schema

        def read(conn: Connection) -> str | None:
            if not self.engine.dialect.has_table(conn, VERSION_TABLE, schema=schema):
                return None
            version = table(VERSION_TABLE, column("version_num"), schema=schema)
            value = conn.execute(select(version.c.version_num)).scalar()
            return None if value is None else str(value)

        return self._read(read)

    def require_schema(self, head: str) -> None:
        """Raise :class:`SchemaNotMigrated` unless the database is at revision ``head``."""
        found = self.schema_revision()
        if found != head:
            state = "has no sqlqueue tables" if found is None else f"is at revision {found}"
            where = "database" if self.dialect.schema is None else f"schema {self.dialect.schema!r}"
            raise SchemaNotMigrated(
                f"the {where} {state}; this sqlqueue needs revision {head}: "
                f"run {self.dialect.migrate_command()} first"
            )

    def database_now(self) -> datetime:
        """The database clock's time now."""

        def read(conn: Connection) -> datetime:
            value: datetime = conn.execute(select(self.dialect.clock())).scalar_one()
            return value

        return self._read(read)

    def stats(self, *, now: datetime | None = None) -> StatsRows:
        """See :func:`readmodel.read_stats`."""
        return self._snapshot(lambda conn: readmodel.read_stats(conn, self.dialect, now=now))

    def activity(self, *, minutes: int, now: datetime | None = None) -> ActivityRows:
        """See :func:`readmodel.read_activity`."""
        return self._snapshot(
            lambda conn: readmodel.read_activity(conn, self.dialect, minutes=minutes, now=now)
        )

    def jobs(self, job_filter: JobFilter, *, limit: int, before_id: int | None) -> list[Job]:
        """See :func:`readmodel.find_jobs`."""
        return self._read(
            lambda conn: readmodel.find_jobs(
                conn, self.dialect, job_filter, limit=limit, before_id=before_id
            )
        )

    def paused_queues(self) -> list[str]:
        """The queues paused now."""
        return self._read(readmodel.paused_queues)

    def queue_controls(self) -> tuple[list[str], dict[str, int]]:
        """The queues paused now, and the queues' limits of running jobs (see
        :func:`readmodel.queue_controls`)."""
        return self._read(readmodel.queue_controls)

    # -- dead letters --------------------------------------------------------------------------

    def requeue(self, *, job_id: int, by: str, reason: str) -> int:
        """See :func:`deadletter.requeue_one`."""
        return self._with_mark(
            lambda conn: deadletter.requeue_one(
                conn, self.dialect, job_id=job_id, by=by, reason=reason
            )
        )

    def requeue_batch(
        self, job_filter: JobFilter, *, limit: int, by: str, reason: str
    ) -> list[int]:
        """See :func:`deadletter.requeue_batch`: one batch, one transaction."""
        return self._with_mark(
            lambda conn: deadletter.requeue_batch(
                conn, self.dialect, job_filter, limit=limit, by=by, reason=reason
            )
        )

    def discard(self, *, job_id: int, by: str, reason: str) -> Job:
        """See :func:`deadletter.discard_one`."""
        return self._with_mark(
            lambda conn: deadletter.discard_one(
                conn, self.dialect, job_id=job_id, by=by, reason=reason
            )
        )

    def discard_batch(
        self, job_filter: JobFilter, *, limit: int, by: str, reason: str
    ) -> list[int]:
        """See :func:`deadletter.discard_batch`: one batch, one transaction."""
        return self._with_mark(
            lambda conn: deadletter.discard_batch(
                conn, self.dialect, job_filter, limit=limit, by=by, reason=reason
            )
        )

    # -- retries -------------------------------------------------------------------------------

    def retry_now(self, job_filter: JobFilter, statuses: Sequence[str] = ("failed",)) -> int:
        """See :func:`due.retry_now`."""
        return self._write(lambda conn: due.retry_now(conn, self.dialect, job_filter, statuses))

    # -- retention and pausing -----------------------------------------------------------------

    def prune_batch(
        self, *, status: str, older_than: float, limit: int, now: datetime | None = None
    ) -> int:
        """See :func:`maintenance.prune_batch`: one batch, one transaction, whose commit need
        not wait for the disk (a batch a crash undoes is pruned again by the next pass: it
        commits whole, jobs and counts together, or not at all)."""
        return self._with_mark(
            lambda conn: maintenance.prune_batch(
                conn, self.dialect, status=status, older_than=older_than, limit=limit, now=now
            ),
            relaxed=True,
        )

    def move_to_history(
        self, *, after: float, keep: float | None, limit: int, since: datetime | None = None
    ) -> int:
        """See :func:`history.move_batch`: one batch, one transaction."""
        return self._write(
            lambda conn: history.move_batch(
                conn, self.dialect, after=after, keep=keep, limit=limit, since=since
            )
        )

    def movable_until(self, *, after: float) -> datetime | None:
        """See :func:`history.movable_until`."""
        return self._read(lambda conn: history.movable_until(conn, self.dialect, after=after))

    def drop_history_days(self, *, older_than: float) -> int:
        """See :func:`history.drop_days`: one transaction, under the counts' mark."""
        return self._with_mark(
            lambda conn: history.drop_days(conn, self.dialect, older_than=older_than)
        )

    def prune_unique_keys(self, *, after: str, limit: int) -> tuple[int, str | None]:
        """See :func:`unique_prune.prune_unique_keys`: one batch, one transaction."""
        return self._write(
            lambda conn: unique_prune.prune_unique_keys(
                conn, self.dialect, after=after, limit=limit
            )
        )

    def fold_counts(self, *, margin: float = 60.0) -> counts.Fold:
        """One fold (see :func:`counts.fold_counts`): a window of the history per call."""
        return self._with_mark(lambda conn: counts.fold_counts(conn, self.dialect, margin=margin))

    def expire_jobs(self, *, limit: int = 500) -> int:
        """See :func:`expiry.expire_jobs`: one batch, one transaction."""
        return self._write(lambda conn: expiry.expire_jobs(conn, self.dialect, limit=limit))

    def age_jobs(self, job_filter: JobFilter, *, by: timedelta) -> int:
        """See :func:`aging.age_jobs`: one transaction."""
        return self._write(lambda conn: aging.age_jobs(conn, job_filter.clauses(), by))

    def reset_counts(self) -> None:
        """See :func:`counts.reset_counts`."""
        self._write(counts.reset_counts)

    def fold_all_counts(self, *, margin: float = 60.0) -> int:
        """Fold until the mark has caught up, one short transaction per window; return how
        many jobs were counted in."""
        folded = 0
        while True:
            fold = self.fold_counts(margin=margin)
            folded += fold.folded
            if fold.caught_up:
                return folded

    def take_duty(self, *, name: str, holder: str, seconds: float) -> bool:
        """See :func:`maintenance.take_duty`."""
        return self._write(
            lambda conn: maintenance.take_duty(
                conn, self.dialect, name=name, holder=holder, seconds=seconds
            )
        )

    def release_duty(self, *, name: str, holder: str) -> None:
        """See :func:`maintenance.release_duty`."""
        self._write(lambda conn: maintenance.release_duty(conn, name=name, holder=holder))

    def pause(self, *, name: str, by: str, reason: str) -> None:
        """See :func:`maintenance.pause_queue`."""
        self._write(
            lambda conn: maintenance.pause_queue(
                conn, self.dialect, name=name, by=by, reason=reason
            )
        )

    def set_queue_limit(self, *, name: str, limit: int | None) -> None:
        """See :func:`maintenance.set_queue_limit`."""
        self._write(
            lambda conn: maintenance.set_queue_limit(conn, self.dialect, name=name, limit=limit)
        )

    def resume(self, *, name: str) -> bool:
        """See :func:`maintenance.resume_queue`."""
        return self._write(lambda conn: maintenance.resume_queue(conn, self.dialect, name=name))

    # -- workers -------------------------------------------------------------------------------

    def announce_worker(
        self, *, worker_id: str, facts: Mapping[str, Any], expires_in: float
    ) -> None:
        """See :func:`workers.announce_worker`."""
        self._write(
            lambda conn: workers.announce_worker(
                conn, self.dialect, worker_id=worker_id, facts=facts, expires_in=expires_in
            )
        )

    def remove_worker(self, *, worker_id: str) -> None:
        """See :func:`workers.remove_worker`."""
        self._write(lambda conn: workers.remove_worker(conn, worker_id=worker_id))

    def prune_gone_workers(self, *, older_than: float) -> int:
        """See :func:`workers.prune_gone_workers`."""
        return self._write(
            lambda conn: workers.prune_gone_workers(conn, self.dialect, older_than=older_than)
        )

    def live_workers(self) -> list[LiveWorker]:
        """See :func:`workers.read_live_workers`."""
        return self._read(lambda conn: workers.read_live_workers(conn, self.dialect))

    def workers(self, *, include_gone: bool) -> list[WorkerInfo]:
        """See :func:`workers.read_workers`."""
        return self._read(
            lambda conn: workers.read_workers(conn, self.dialect, include_gone=include_gone)
        )

    def seen_workers(self) -> list[SeenWorker]:
        """See :func:`workers.read_seen_workers`."""
        return self._read(lambda conn: workers.read_seen_workers(conn, self.dialect))

    def overdue_types(self, *, queues: Sequence[str], older_than: float) -> list[OverdueType]:
        """See :func:`workers.read_overdue_types`."""
        return self._read(
            lambda conn: workers.read_overdue_types(
                conn, self.dialect, queues=queues, older_than=older_than
            )
        )

    # -- actions on waiting jobs, recorded (see job_actions) -----------------------------------

    def count_jobs(self, job_filter: JobFilter) -> int:
        """How many jobs match ``job_filter``."""
        return self._read(lambda conn: readmodel.count_jobs(conn, self.dialect, job_filter))

    def batches(self, *, limit: int, before_id: int | None) -> list[BatchStatus]:
        """See :func:`batches.read_batches`."""
        return self._snapshot(
            lambda conn: batches.read_batches(conn, limit=limit, before_id=before_id)
        )

    def workflows(
        self, *, limit: int, before_id: int | None, workflow_id: int | None = None
    ) -> list[WorkflowSummary]:
        """See :func:`workflow_list.read_workflow_summaries`."""
        return self._snapshot(
            lambda conn: read_workflow_summaries(
                conn, limit=limit, before_id=before_id, workflow_id=workflow_id
            )
        )

    def job_actions(self, job_id: int) -> list[JobAction]:
        """See :func:`job_actions.read_job_actions`."""
        return self._read(lambda conn: job_actions.read_job_actions(conn, job_id))

    def reschedule(self, *, job_id: int, run_at: datetime, record: Record) -> Job:
        """See :func:`job_actions.reschedule_job`."""
        return self._write(
            lambda conn: job_actions.reschedule_job(conn, self.dialect, job_id, run_at, record)
        )

    def make_due(
        self, job_filter: JobFilter, *, statuses: Sequence[str], record: Record | None
    ) -> list[int]:
        """See :func:`job_actions.make_due`."""
        return self._write(
            lambda conn: job_actions.make_due(conn, self.dialect, job_filter, statuses, record)
        )

    def cancel_batch(
        self, job_filter: JobFilter, *, limit: int, record: Record | None
    ) -> CancelBatch:
        """See :func:`job_actions.cancel_batch`. When it left jobs another transaction held,
        wait for the holder of the first (:func:`job_actions.wait_for_holder`, a transaction
        of its own) and say the filter is not exhausted: the next batch reads them again,
        cancels those still waiting and leaves those the holder claimed. One row a wait: a
        transaction waiting for several would hold the first while it waits for the next."""
        batch = self._write(
            lambda conn: job_actions.cancel_batch(
                conn, self.dialect, job_filter, limit=limit, record=record
            )
        )
        if not batch.held:
            return batch
        first = batch.held[0]
        self._write(lambda conn: job_actions.wait_for_holder(conn, self.dialect, first))
        return batch._replace(exhausted=False)
