"""The operators' API on :class:`sqlqueue.Queue`: stats, health, search, dead-letter actions,
actions on waiting jobs (run now, reschedule; each recorded with who and why), batches,
workflows, retention and pause. It needs only the database (no task registry), so the CLI
builds a bare ``Queue`` from a URL and calls the same methods an app would."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from datetime import datetime
from functools import cached_property
from typing import TYPE_CHECKING

from sqlqueue._batch import BatchStatus
from sqlqueue._errors import ConfigurationError
from sqlqueue._job import Job, JobStatus
from sqlqueue._job_action import JobAction
from sqlqueue._limits import (
    check_action,
    check_age,
    check_filter,
    check_integer,
    check_moment,
    check_queue_name,
    check_text,
)
from sqlqueue._operators.stats import (
    Activity,
    Health,
    Stats,
    activity_from_rows,
    check_health,
    stats_from_rows,
)
from sqlqueue._policies.concurrency import check_limit
from sqlqueue._policies.retention import check_prunable
from sqlqueue._schema import batches, jobs
from sqlqueue._store.admin import Admin
from sqlqueue._store.counts import CountsBusy
from sqlqueue._store.filters import JobFilter
from sqlqueue._store.job_actions import WAITING, Record
from sqlqueue._tags import check_tag
from sqlqueue._worker_info import WorkerInfo
from sqlqueue._workflow_summary import WorkflowSummary

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from sqlqueue.dialects import Dialect

__all__ = ["DEFAULT_BATCH_SIZE", "Operations"]

#: Rows acted on per transaction by requeue_where, discard_where and prune.
DEFAULT_BATCH_SIZE = 500


_who_and_why = check_action


def _page_limit(limit: int) -> int:
    if not 1 <= limit <= 10_000:
        raise ConfigurationError(f"limit must be between 1 and 10000, got {limit!r}")
    return limit


def _status(status: str | None) -> str | None:
    if status is None:
        return None
    try:
        return JobStatus(status).value
    except ValueError:
        names = ", ".join(s.value for s in JobStatus)
        raise ConfigurationError(f"status must be one of {names}; got {status!r}") from None


class Operations:
    """Mixed into :class:`sqlqueue.Queue`: what an operator does with the jobs in its database."""

    engine: Engine
    dialect: Dialect

    @cached_property
    def admin(self) -> Admin:
        """The store's operator queries for this queue's database."""
        return Admin(self.dialect.bind_tables(self.engine), self.dialect)

    # -- reading -------------------------------------------------------------------------------

    def database_now(self) -> datetime:
        """The database clock's time now: every job time is stamped by it, so a relative time
        ("the last 2 hours") counts back from here, not from this machine's clock."""
        return self.admin.database_now()

    def stats(self) -> Stats:
        """Counts by status (overall, per queue, per job type), each queue's oldest due age and
        pause state, failures and deaths in the last hour, and the top errors — one read."""
        return stats_from_rows(self.admin.stats())

    def health(
        self,
        *,
        max_queued_age: float = 300.0,
        max_dead_last_hour: int = 10,
        max_same_error: int = 20,
        max_unserved: float = 300.0,
    ) -> Health:
        """The alarms: more than ``max_dead_last_hour`` unhandled deaths in the last hour,
        more than ``max_same_error`` failed/dead jobs with one error, a due job older than
        ``max_queued_age`` seconds in a queue that is not paused (``queued_age``) — or, where
        live workers serve that queue but none has a task for the job's type,
        ``unknown_type``, naming the types — and ``no_workers``: a queue (not paused) has
        due jobs and no live worker has served it for more than ``max_unserved`` seconds,
        counted on the database clock from its oldest due job's due time or the last heartbeat
        of a worker serving it, whichever is later. ``.ok`` when none is raised."""
        if min(max_queued_age, max_dead_last_hour, max_same_error, max_unserved) < 0:
            raise ConfigurationError("health thresholds must be >= 0")
        stats = self.stats()
        late = [
            name
            for name, queue in stats.queues.items()
            if (queue.oldest_queued_age_seconds or 0.0) > max_queued_age and not queue.paused
        ]
        # Only a late queue costs more reads: which types its live workers know, and its late
        # jobs by type.
        live = self.admin.live_workers() if late else []
        served = [name for name in late if any(name in worker.queues for worker in live)]
        overdue = (
            self.admin.overdue_types(queues=served, older_than=max_queued_age) if served else []
        )
        # And only a queue whose oldest due job waited over max_unserved: every worker's row.
        unserved = any(
            (queue.oldest_queued_age_seconds or 0.0) > max_unserved and not queue.paused
            for queue in stats.queues.values()
        )
        return check_health(
            stats,
            max_queued_age=max_queued_age,
            max_dead_last_hour=max_dead_last_hour,
            max_same_error=max_same_error,
            live_workers=live,
            overdue=overdue,
            max_unserved=max_unserved,
            seen_workers=self.admin.seen_workers() if unserved else (),
        )

    def workers(self, *, include_gone: bool = False) -> list[WorkerInfo]:
        """The worker processes alive now (their last heartbeat less than three heartbeat
        intervals ago, by the database clock), live first, by host and pid; ``include_gone``:
        also the workers that vanished without a clean exit (killed, lost their host) in the
        last day. A worker that stopped cleanly has removed itself."""
        return self.admin.workers(include_gone=include_gone)

    def activity(self, *, minutes: int = 60) -> Activity:
        """Jobs that succeeded, failed (waiting for a retry) and died in each of the last
        ``minutes`` minutes (1 to 1440), oldest first — the throughput chart of the web page."""
        if not 1 <= minutes <= 1440:
            raise ConfigurationError(f"minutes must be between 1 and 1440, got {minutes!r}")
        return activity_from_rows(self.admin.activity(minutes=minutes), minutes)

    def jobs(
        self,
        *,
        status: str | None = None,
        job_type: str | None = None,
        queue: str | None = None,
        error_contains: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int = 50,
        before_id: int | None = None,
        job_ids: Iterable[int] | None = None,
        group_key: str | None = None,
        unhandled: bool = False,
        batch_id: int | None = None,
        idempotency_key: str | None = None,
        tag: str | None = None,
    ) -> list[Job]:
        """Jobs matching every given filter, newest first, at most ``limit``. Page on with
        ``before_id=`` the last id of the previous page. ``since``/``until`` bound the time of
        each job's latest change; ``error_contains`` searches ``last_error``; ``unhandled``
        keeps only dead jobs nobody has requeued or discarded (what :meth:`requeue_where` and
        :meth:`discard_where` would take); ``batch_id``: the children of that batch;
        ``idempotency_key``: the job enqueued with that key (a periodic slot's, for one);
        ``tag``: the jobs enqueued with that tag (on the job or its task)."""
        if before_id is not None:
            check_integer("before_id", before_id, jobs.c.id, ConfigurationError, low=0)
        if idempotency_key is not None:
            check_text(
                "idempotency_key", idempotency_key, jobs.c.idempotency_key, ConfigurationError
            )
        job_filter = self._job_filter(
            status, job_type, queue, error_contains, since, until, job_ids, group_key, batch_id
        )
        if tag is not None:
            check_tag("tag", tag, ConfigurationError)
        job_filter = replace(
            job_filter, unhandled=unhandled, idempotency_key=idempotency_key, tag=tag
        )
        return self.admin.jobs(job_filter, limit=_page_limit(limit), before_id=before_id)

    def count_jobs(
        self,
        *,
        status: str | None = None,
        job_type: str | None = None,
        queue: str | None = None,
        error_contains: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        job_ids: Iterable[int] | None = None,
        group_key: str | None = None,
        unhandled: bool = False,
        batch_id: int | None = None,
    ) -> int:
        """How many jobs :meth:`jobs` would list with the same filters, however many pages
        (what a bulk action's confirmation states). It counts rows: on a big table, narrow it."""
        job_filter = self._job_filter(
            status, job_type, queue, error_contains, since, until, job_ids, group_key, batch_id
        )
        return self.admin.count_jobs(replace(job_filter, unhandled=unhandled))

    @staticmethod
    def _job_filter(
        status: str | None,
        job_type: str | None,
        queue: str | None,
        error_contains: str | None,
        since: datetime | None,
        until: datetime | None,
        job_ids: Iterable[int] | None,
        group_key: str | None,
        batch_id: int | None,
    ) -> JobFilter:
        ids = check_filter(
            job_type=job_type,
            queue=queue,
            group_key=group_key,
            error_contains=error_contains,
            since=since,
            until=until,
            job_ids=job_ids,
        )
        if batch_id is not None:
            check_integer("batch_id", batch_id, batches.c.id, ConfigurationError, low=0)
        return JobFilter(
            status=_status(status),
            job_type=job_type,
            queue=queue,
            error_contains=error_contains,
            since=since,
            until=until,
            job_ids=ids,
            group_key=group_key,
            batch_id=batch_id,
        )

    def batches(self, *, limit: int = 50, before_id: int | None = None) -> list[BatchStatus]:
        """The newest batches with their counts, at most ``limit``; page on with
        ``before_id=`` the last id of the previous page."""
        if before_id is not None:
            check_integer("before_id", before_id, batches.c.id, ConfigurationError, low=0)
        return self.admin.batches(limit=_page_limit(limit), before_id=before_id)

    def workflows(self, *, limit: int = 50, before_id: int | None = None) -> list[WorkflowSummary]:
        """The newest workflows with their counts and the steps holding each up, at most
        ``limit``; page on with ``before_id=`` the last id of the previous page. Reads no
        workflow's steps one by one (:meth:`get_workflow` has them)."""
        if before_id is not None:
            check_integer("before_id", before_id, batches.c.id, ConfigurationError, low=0)
        return self.admin.workflows(limit=_page_limit(limit), before_id=before_id)

    def workflow_summary(self, workflow_id: int) -> WorkflowSummary | None:
        """Workflow ``workflow_id`` as :meth:`workflows` lists it, or ``None`` (no such
        workflow, or a plain batch)."""
        check_integer("workflow_id", workflow_id, batches.c.id, ConfigurationError, low=0)
        found = self.admin.workflows(limit=1, before_id=None, workflow_id=workflow_id)
        return found[0] if found else None

    def job_actions(self, job_id: int) -> list[JobAction]:
        """What operators did to job ``job_id`` besides requeue and discard (which the job
        records itself): cancel, run now, reschedule — who, when, why, oldest first."""
        check_integer("job_id", job_id, jobs.c.id, ConfigurationError, low=0)
        return self.admin.job_actions(job_id)

    # -- dead letters --------------------------------------------------------------------------

    def requeue(self, job_id: int, *, by: str, reason: str) -> int:
        """Requeue dead job ``job_id`` as a NEW job; the dead row records who, when and why."""
        _who_and_why("requeue", by, reason)
        check_integer("job_id", job_id, jobs.c.id, ConfigurationError, low=0)
        return self.admin.requeue(job_id=job_id, by=by, reason=reason)

    def requeue_where(
        self,
        *,
        by: str,
        reason: str,
        job_type: str | None = None,
        queue: str | None = None,
        error_contains: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        job_ids: Iterable[int] | None = None,
        limit: int | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
    ) -> list[int]:
        """Requeue every matching dead job that nobody has requeued or discarded, like
        :meth:`requeue`, in batches of ``batch_size`` (one short transaction each), oldest first;
        at most ``limit``. Returns the new jobs' ids. A dead job is requeued once, however many
        operators or processes ask at the same time."""
        _who_and_why("requeue_where", by, reason)
        job_filter = self._dead_filter(job_type, queue, error_contains, since, until, job_ids)
        return self._in_batches(
            lambda n: _counted(
                self.admin.requeue_batch(job_filter, limit=n, by=by, reason=reason), n
            ),
            limit,
            batch_size,
        )

    def discard(self, job_id: int, *, by: str, reason: str) -> Job:
        """Mark dead job ``job_id`` handled without running it: it stays ``dead``, records who,
        when and why, and no longer counts toward the dead-jobs alarm. Returns it."""
        _who_and_why("discard", by, reason)
        check_integer("job_id", job_id, jobs.c.id, ConfigurationError, low=0)
        return self.admin.discard(job_id=job_id, by=by, reason=reason)

    def discard_where(
        self,
        *,
        by: str,
        reason: str,
        job_type: str | None = None,
        queue: str | None = None,
        error_contains: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        job_ids: Iterable[int] | None = None,
        limit: int | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
    ) -> list[int]:
        """:meth:`discard` every matching dead job nobody has requeued or discarded, in batches;
        returns their ids."""
        _who_and_why("discard_where", by, reason)
        job_filter = self._dead_filter(job_type, queue, error_contains, since, until, job_ids)
        return self._in_batches(
            lambda n: _counted(
                self.admin.discard_batch(job_filter, limit=n, by=by, reason=reason), n
            ),
            limit,
            batch_size,
        )

    # -- retries -------------------------------------------------------------------------------

    def retry_now(
        self,
        *,
        job_type: str | None = None,
        queue: str | None = None,
        job_ids: Iterable[int] | None = None,
    ) -> int:
        """Make every failed job matching all the given filters (none: every failed job) due
        now instead of at the end of its backoff; return how many were waiting. Each keeps its
        attempt count: the next attempt is the one it was waiting for."""
        ids = check_filter(job_type=job_type, queue=queue, job_ids=job_ids)
        return self.admin.retry_now(JobFilter(job_type=job_type, queue=queue, job_ids=ids))

    def run_now(
        self, job_ids: Iterable[int], *, by: str | None = None, reason: str | None = None
    ) -> int:
        """Make the jobs ``job_ids`` that wait for a later time due now, whatever they wait
        for: a retry's backoff, a snooze, or the ``delay``/``run_at`` they were enqueued with
        (queued and failed jobs; others are left alone); return how many were waiting.
        Attempt counts are kept. :func:`sqlqueue.testing.drain` uses it for snoozed jobs.
        With ``by`` and ``reason`` (an operator's "retry now"), each job changed records who
        and why (:meth:`job_actions`)."""
        record = self._record("run_now", by, reason)
        ids = check_filter(job_ids=job_ids) or []
        if not ids:
            return 0
        if record is None:
            return self.admin.retry_now(JobFilter(job_ids=ids), statuses=WAITING)
        return len(self.admin.make_due(JobFilter(job_ids=ids), statuses=WAITING, record=record))

    def reschedule(self, job_id: int, run_at: datetime, *, by: str, reason: str) -> Job:
        """Give queued or failed job ``job_id`` a new run time ``run_at`` (timezone-aware; its
        attempts are kept), recording who and why; returns it. Any other status is a
        :class:`~sqlqueue.JobStateError`, a job that is not there :class:`~sqlqueue.JobNotFound`."""
        _who_and_why("reschedule", by, reason)
        check_integer("job_id", job_id, jobs.c.id, ConfigurationError, low=0)
        check_moment("run_at", run_at, jobs.c.next_run_at, ConfigurationError)
        detail = {"run_at": run_at.isoformat()}
        record = Record(action="reschedule", by=by, reason=reason, detail=detail)
        return self.admin.reschedule(job_id=job_id, run_at=run_at, record=record)

    @staticmethod
    def _record(action: str, by: str | None, reason: str | None) -> Record | None:
        """Who acted and why, checked; ``None`` when neither is given."""
        if by is None and reason is None:
            return None
        _who_and_why(action, by, reason)
        return Record(action=action, by=str(by), reason=str(reason))

    @staticmethod
    def _dead_filter(
        job_type: str | None,
        queue: str | None,
        error_contains: str | None,
        since: datetime | None,
        until: datetime | None,
        job_ids: Iterable[int] | None,
    ) -> JobFilter:
        if error_contains == "":
            raise ConfigurationError(
                "error_contains must not be empty (it would match every dead job); pass None "
                "for no filter"
            )
        ids = check_filter(
            job_type=job_type,
            queue=queue,
            error_contains=error_contains,
            since=since,
            until=until,
            job_ids=job_ids,
        )
        return JobFilter(
            job_type=job_type,
            queue=queue,
            error_contains=error_contains,
            since=since,
            until=until,
            job_ids=ids,
            unhandled=True,
        )

    def _breathe(self, started: float) -> None:
        """After a batch, on a single-writer database, leave the write lock free for as long as
        the batch held it (at most 0.2 s): other processes' claims get in between batches."""
        if self.dialect.single_writer:
            time.sleep(min(time.monotonic() - started, 0.2))

    def _in_batches(
        self, batch: Callable[[int], tuple[list[int], bool]], limit: int | None, batch_size: int
    ) -> list[int]:
        """Run ``batch(size)`` (one short transaction: the ids it acted on, and whether the
        filter has nothing more for it) until it has nothing more or ``limit`` is reached."""
        if limit is not None and limit < 0:
            raise ConfigurationError(f"limit must be >= 0, got {limit!r}")
        if batch_size < 1:
            raise ConfigurationError(f"batch_size must be >= 1, got {batch_size!r}")
        done: list[int] = []
        while limit is None or len(done) < limit:
            size = batch_size if limit is None else min(batch_size, limit - len(done))
            started = time.monotonic()
            ids, exhausted = batch(size)
            done.extend(ids)
            if exhausted:
                break
            self._breathe(started)
        return done

    # -- retention and pausing -----------------------------------------------------------------

    def prune(
        self,
        *,
        older_than: float,
        statuses: Sequence[str] = ("succeeded", "cancelled"),
        batch_size: int = 1000,
    ) -> int:
        """Delete finished jobs (``statuses``: succeeded, cancelled, dead) whose ``finished_at``
        is more than ``older_than`` seconds ago, ``batch_size`` rows per short transaction;
        return how many went. Never queued, running or failed jobs. A finished batch's row goes
        with the last job that refers to it; batch counts never change. Unique keys that no job
        carries any more go too. Where succeeded jobs move into a partitioned history
        (PostgreSQL), its days that ended more than ``older_than`` seconds ago are dropped
        whole: the moved jobs of the day that ends later stay until it does."""
        older_than = check_age("older_than", older_than, jobs.c.finished_at, ConfigurationError)
        if batch_size < 1:
            raise ConfigurationError(f"batch_size must be >= 1, got {batch_size!r}")
        wanted = tuple(dict.fromkeys(statuses))
        check_prunable(wanted)
        deleted = 0
        for status in wanted:
            if status == "succeeded":
                deleted += self._when_counts_free(
                    lambda: self.admin.drop_history_days(older_than=older_than)
                )
            while True:
                started = time.monotonic()
                count = self._prune_batch(status, older_than, batch_size)
                deleted += count
                if count < batch_size:
                    break
                self._breathe(started)
        self._prune_unique_keys(batch_size)
        return deleted

    def _prune_unique_keys(self, batch_size: int) -> None:
        """Delete the lock rows of unique keys that no job carries any more (the jobs just
        pruned may have been the last to), walking the whole table a batch at a time."""
        after: str | None = ""
        while after is not None:
            started = time.monotonic()
            _, after = self.admin.prune_unique_keys(after=after, limit=batch_size)
            self._breathe(started)

    def _prune_batch(self, status: str, older_than: float, batch_size: int) -> int:
        """One prune batch (see :meth:`_when_counts_free`)."""
        return self._when_counts_free(
            lambda: self.admin.prune_batch(status=status, older_than=older_than, limit=batch_size)
        )

    @staticmethod
    def _when_counts_free(prune: Callable[[], int]) -> int:
        """Run ``prune``; while a fold or another prune holds the counts, wait a little and
        try again (for up to ~10 s, then say so)."""
        for wait in (0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 3.2):
            try:
                return prune()
            except CountsBusy:
                time.sleep(wait)
        return prune()

    def pause(self, name: str, *, by: str, reason: str) -> None:
        """Stop every worker claiming from queue ``name`` (within its poll interval; at once
        where wake-ups reach it); running jobs finish, and enqueueing still works."""
        _who_and_why("pause", by, reason)
        check_queue_name("pause: queue name", name)
        self.admin.pause(name=name, by=by, reason=reason)

    def resume(self, name: str) -> bool:
        """Let workers claim from queue ``name`` again; returns whether it was paused."""
        check_queue_name("resume: queue name", name)
        return self.admin.resume(name=name)

    def set_queue_limit(self, name: str, limit: int | None) -> None:
        """Let at most ``limit`` jobs of queue ``name`` run at once across all workers
        (``None`` lifts the limit). Held in the database: every worker obeys a change within
        its poll interval (at once where wake-ups reach it); jobs already running finish."""
        check_queue_name("set_queue_limit: queue name", name)
        if limit is not None:
            check_limit("set_queue_limit: limit", limit)
        self.admin.set_queue_limit(name=name, limit=limit)

    def paused_queues(self) -> list[str]:
        """The names of the queues paused now."""
        return self.admin.paused_queues()


def _counted(ids: list[int], size: int) -> tuple[list[int], bool]:
    """A batch that takes its rows in one locking read (``SKIP LOCKED``, ``LIMIT size``) and
    acts on every row it took: it has nothing more when it comes back short."""
    return ids, len(ids) < size
