"""Helpers for an app's own tests: what its code enqueued, and running those jobs in-process.

``assert_enqueued`` and ``enqueued_jobs`` read the queue's database through the operations API
(``Queue.jobs``); ``age_jobs`` moves jobs back in time (a job that waited an hour, a success
from last week) without touching the clock; ``drain`` runs due jobs with a real burst
:class:`~sqlqueue.Worker`, so handlers get the same attempt pipeline as in production: their
``JobContext``, timeouts, retries with backoff, dead jobs, snoozes and cancellations. The
pytest fixtures (``sqlqueue_queue`` …) live in the plugin that pytest loads from the installed
package.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlqueue import ConfigurationError, Job, JobStatus, Queue, Worker
from sqlqueue._store.filters import JobFilter

__all__ = [
    "DrainResult",
    "age_jobs",
    "assert_enqueued",
    "drain",
    "drain_async",
    "enqueued_jobs",
]

#: Rows read per ``Queue.jobs`` page.
_PAGE = 10_000
#: Statuses a job can still leave by itself: the ones a drain looks at.
_UNFINISHED = (JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.FAILED)
#: With ``retry_now``, rounds in a row in which jobs only snoozed before a drain gives up on
#: them (a handler that always snoozes would keep it going for ever).
_SNOOZING_ROUNDS = 10


@dataclass(frozen=True, kw_only=True)
class DrainResult:
    """What became of the jobs a :func:`drain` ran.

    ``succeeded``, ``dead`` and ``cancelled`` count jobs that ended so; ``failed`` counts
    failed attempts that were scheduled for a retry (a job retried twice counts two);
    ``snoozed`` counts attempts that snoozed; ``waiting`` is how many jobs the drain left
    unfinished (a retry or snooze not yet due, or a job still running elsewhere). An attempt
    refused by a rate limit or an open circuit breaker is a snooze, as on a worker.

    The counts come from the jobs as they were before and after each round of the drain (one
    burst worker): a job that snoozed or failed and then ran again within one round counts
    its failures (from its error history) and its end, not the snooze.
    """

    succeeded: int = 0
    failed: int = 0
    dead: int = 0
    snoozed: int = 0
    cancelled: int = 0
    waiting: int = 0

    @property
    def ran(self) -> int:
        """How many attempts ran in all (snoozed ones included)."""
        return self.succeeded + self.failed + self.dead + self.snoozed + self.cancelled

    def __add__(self, other: DrainResult) -> DrainResult:
        return DrainResult(
            succeeded=self.succeeded + other.succeeded,
            failed=self.failed + other.failed,
            dead=self.dead + other.dead,
            snoozed=self.snoozed + other.snoozed,
            cancelled=self.cancelled + other.cancelled,
            waiting=other.waiting,  # the later count replaces the earlier
        )


# -- what was enqueued ---------------------------------------------------------------------------


def enqueued_jobs(queue: Queue, job_type: str | None = None) -> list[Job]:
    """Every job in ``queue``'s database (of ``job_type``, if given), whatever its status, in
    the order they were enqueued."""
    found: list[Job] = []
    before_id: int | None = None
    while True:
        page = queue.jobs(job_type=job_type, limit=_PAGE, before_id=before_id)
        found.extend(page)
        if len(page) < _PAGE:
            return found[::-1]
        before_id = page[-1].id


def assert_enqueued(
    queue: Queue,
    job_type: str,
    payload: Mapping[str, Any] | None = None,
    count: int | None = None,
) -> list[Job]:
    """Assert that jobs of ``job_type`` were enqueued whose payload contains ``payload`` (nested
    mappings match as subsets too; other values must be equal): exactly ``count`` of them, or
    at least one. Returns the matching jobs. The failure message lists what *was* enqueued."""
    if count is not None and count < 0:
        raise ConfigurationError(f"count must be >= 0, got {count!r}")
    everything = enqueued_jobs(queue)
    matching = [
        job
        for job in everything
        if job.job_type == job_type and (payload is None or _contains(job.payload, payload))
    ]
    if (len(matching) == count) if count is not None else bool(matching):
        return matching
    wanted = "at least one" if count is None else f"exactly {count}"
    described = f"{job_type!r} job" + (
        "" if payload is None else f" with payload ⊇ {_json(payload)}"
    )
    lines = [f"expected {wanted} {described}, found {len(matching)}."]
    if everything:
        lines.append(f"Enqueued ({len(everything)}):")
        lines += [
            f"  #{job.id} {job.job_type} {_json(job.payload)} ({job.status})" for job in everything
        ]
    else:
        lines.append("Nothing was enqueued.")
    raise AssertionError("\n".join(lines))


def _contains(actual: Any, expected: Any) -> bool:
    if isinstance(expected, Mapping):
        return isinstance(actual, Mapping) and all(
            key in actual and _contains(actual[key], value) for key, value in expected.items()
        )
    return bool(actual == expected)


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str, ensure_ascii=False)


# -- moving them in time -------------------------------------------------------------------------


def age_jobs(
    queue: Queue,
    job_ids: Iterable[int] | None = None,
    *,
    by: timedelta,
    status: JobStatus | str | None = None,
    job_type: str | None = None,
) -> int:
    """Make jobs older: every time their rows hold (enqueued, due, started, finished, last
    changed, lease expiry, cancelled, requeued, discarded) moves back by ``by``, as if all of
    it had happened that much earlier. Returns how many jobs moved.

    Which jobs: those in ``job_ids`` that also match ``status`` and ``job_type``; with none of
    the three, every job in the database. For a test that needs "a job queued an hour ago",
    "a success from last week" (retention, stats, the activity chart) or "a running job whose
    lease ran out" (the reaper takes it back), without waiting and without a fake clock::

        ids = [send.enqueue(conn)]
        age_jobs(queue, ids, by=timedelta(hours=1))
        assert queue.stats().queues["mail"].oldest_queued_age_seconds >= 3600

    Stats stay exact: the finished-jobs rollup is recounted when a finished job moves. The
    database's clock is untouched, so a job due now is overdue by ``by`` afterwards.
    """
    if not isinstance(by, timedelta):
        raise ConfigurationError(f"by must be a timedelta, got {by!r}")
    if by <= timedelta(0):
        raise ConfigurationError(f"by must be a positive timedelta, got {by!r}")
    if isinstance(job_ids, (str, bytes, int)):
        raise ConfigurationError(f"job_ids must be a list of ids, not {job_ids!r}")
    if status is not None:
        try:
            status = JobStatus(status)
        except ValueError:
            names = ", ".join(s.value for s in JobStatus)
            raise ConfigurationError(f"status must be one of {names}; got {status!r}") from None
    job_filter = JobFilter(
        status=None if status is None else status.value,
        job_type=job_type,
        job_ids=None if job_ids is None else [int(job_id) for job_id in job_ids],
    )
    if job_filter.job_ids == []:
        return 0
    return queue.admin.age_jobs(job_filter, by=by)


# -- running them --------------------------------------------------------------------------------


def drain(
    queue: Queue,
    *,
    queues: Sequence[str] | None = None,
    retry_now: bool = False,
    concurrency: int = 1,
) -> DrainResult:
    """Run every due job of ``queue`` (in ``queues``; default: its tasks' queues) in this
    process, with a burst :class:`~sqlqueue.Worker` of ``concurrency`` slots (1: jobs run one
    by one, in the order a worker claims them), until none is due and none runs.

    A failed attempt is retried after its backoff, as in production, so by default it waits and
    the drain returns (a snoozed job too); with ``retry_now=True`` failed and snoozed jobs are
    made due at once (:meth:`Queue.retry_now`, :meth:`Queue.run_now`) and the drain goes on
    until every job is finished (or has only snoozed for 10 rounds in a row; jobs enqueued
    with a ``delay`` still wait for it). Jobs the handlers enqueue run too. Call :func:`drain_async`
    from a running event loop.
    """
    return asyncio.run(
        drain_async(queue, queues=queues, retry_now=retry_now, concurrency=concurrency)
    )


async def drain_async(
    queue: Queue,
    *,
    queues: Sequence[str] | None = None,
    retry_now: bool = False,
    concurrency: int = 1,
) -> DrainResult:
    """:func:`drain` inside a running event loop (an async test): the worker serves on it.

    All rounds of one drain share the loop, and so the connections async handlers open."""
    rounds = _Rounds(queue, queues, retry_now, concurrency)
    async for worker in _async(rounds):
        await worker.serve(burst=True)
    return rounds.result


async def _async(rounds: _Rounds) -> AsyncIterator[Worker]:
    for worker in rounds:
        yield worker


@dataclass(frozen=True)
class _Seen:
    """What a drain round needs of a job to tell what happened to it."""

    status: JobStatus
    attempts: int
    errors: int
    next_run_at: Any

    @classmethod
    def of(cls, job: Job) -> _Seen:
        return cls(job.status, job.attempts, len(job.errors), job.next_run_at)


class _Rounds:
    """A drain's rounds: each yields a burst worker to run, and compares the unfinished jobs
    before it with the same jobs (and any new ones) after it."""

    def __init__(
        self, queue: Queue, queues: Sequence[str] | None, retry_now: bool, concurrency: int
    ) -> None:
        if isinstance(queues, str):
            raise ConfigurationError(f"queues must be a list of names, not {queues!r}")
        self.queue = queue
        self.queues = list(
            queues or sorted({t.queue for t in queue.tasks.values()} | {queue.default_queue})
        )
        self.retry_now = retry_now
        self.concurrency = concurrency
        self.result = DrainResult()
        #: The jobs that snoozed in the latest round (``retry_now`` makes them due again).
        self.snoozed: list[int] = []

    def __iter__(self) -> Iterator[Worker]:
        snoozing_rounds = 0
        while True:
            if self.retry_now:
                for name in self.queues:
                    self.queue.retry_now(queue=name)
                self.queue.run_now(self.snoozed)
            before, newest = self._unfinished(), self._newest_id()
            yield self.queue.worker(
                queues=self.queues, concurrency=self.concurrency, poll_interval=0.05
            )
            outcome = self._compare(before, newest)
            self.result += outcome
            if not self.retry_now or outcome.ran == 0:
                return
            # A round in which jobs only snoozed: a job that snoozes whatever happens would
            # keep the drain going for ever, so a few such rounds in a row end it (waiting).
            snoozing_rounds = snoozing_rounds + 1 if outcome.ran == outcome.snoozed else 0
            if snoozing_rounds > _SNOOZING_ROUNDS or not (self.snoozed or self._failed()):
                return

    def _unfinished(self) -> dict[int, _Seen]:
        seen: dict[int, _Seen] = {}
        for name in self.queues:
            for status in _UNFINISHED:
                seen.update((job.id, _Seen.of(job)) for job in self._all(status=status, queue=name))
        return seen

    def _failed(self) -> bool:
        return any(
            self.queue.jobs(status=JobStatus.FAILED, queue=name, limit=1) for name in self.queues
        )

    def _newest_id(self) -> int:
        newest = self.queue.jobs(limit=1)
        return newest[0].id if newest else 0

    def _all(self, **where: Any) -> list[Job]:
        found: list[Job] = []
        before_id: int | None = None
        while True:
            page = self.queue.jobs(limit=_PAGE, before_id=before_id, **where)
            found += page
            if len(page) < _PAGE:
                return found
            before_id = page[-1].id

    def _added_since(self, newest: int) -> list[Job]:
        """Jobs enqueued after ``newest`` (by the handlers), in the drained queues."""
        added: list[Job] = []
        before_id: int | None = None
        while True:
            page = self.queue.jobs(limit=_PAGE, before_id=before_id)
            fresh = [job for job in page if job.id > newest]
            added += [job for job in fresh if job.queue in self.queues]
            if len(fresh) < len(page) or len(page) < _PAGE:
                return added
            before_id = page[-1].id

    def _compare(self, before: dict[int, _Seen], newest: int) -> DrainResult:
        after = {job.id: job for job in self._all(job_ids=before)} if before else {}
        after.update((job.id, job) for job in self._added_since(newest))
        start = _Seen(JobStatus.QUEUED, 0, 0, None)
        snoozed: list[int] = []
        counts = dict.fromkeys(
            ("succeeded", "failed", "dead", "snoozed", "cancelled", "waiting"), 0
        )
        for job_id, job in after.items():
            was = before.get(job_id, start)
            failures = len(job.errors) - was.errors
            if job.status in (JobStatus.DEAD, JobStatus.CANCELLED) and job.status != was.status:
                counts[job.status.value] += 1
                failures -= 1  # the last failure is the one that ended it
            elif job.status == JobStatus.SUCCEEDED:
                counts["succeeded"] += 1
            elif (
                job.status == JobStatus.QUEUED
                and job.attempts == was.attempts
                and was.next_run_at is not None
                and job.next_run_at > was.next_run_at
            ):
                counts["snoozed"] += 1
                snoozed.append(job_id)
            if job.status in _UNFINISHED:
                counts["waiting"] += 1
            counts["failed"] += max(failures, 0)
        self.snoozed = snoozed
        return DrainResult(**counts)
