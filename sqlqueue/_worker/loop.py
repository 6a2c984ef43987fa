"""The worker: claims due jobs, runs their handlers, records outcomes, keeps leases alive.

A worker is one asyncio event loop in one process. Async handlers run on the loop, sync
handlers in a thread pool, SQL on a single database thread. Around the claim loop run three
duties: the completer (batched outcome writes), the lease keeper (heartbeats) and the reaper.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any

from sqlqueue._errors import ConfigurationError, DatabaseError
from sqlqueue._logs import current_worker
from sqlqueue._store.limited_claim import ClaimLimits
from sqlqueue._store.maintenance import PAUSES_CHANGED
from sqlqueue._store.rows import ClaimedJob
from sqlqueue._worker.attempt import Runtime
from sqlqueue._worker.classify import Outcome
from sqlqueue._worker.dbthread import DatabaseThread
from sqlqueue._worker.floor_probe import FloorProbe
from sqlqueue._worker.heartbeat import Heartbeat
from sqlqueue._worker.launch import Launcher
from sqlqueue._worker.listener import Listener
from sqlqueue._worker.observe import Observers
from sqlqueue._worker.outbox import Completer, outcome_fields, succeeded_batches
from sqlqueue._worker.reaper import Reaper
from sqlqueue._worker.registry import Registration
from sqlqueue._worker.retries import Backoff, retry_quickly
from sqlqueue._worker.running import Contexts
from sqlqueue._worker.scheduler import Scheduler
from sqlqueue._worker.settings import WorkerSettings
from sqlqueue._worker.slots import Pool, Slots
from sqlqueue._worker.threads import HandlerThreads
from sqlqueue._worker.upkeep import Upkeep, every

if TYPE_CHECKING:
    from sqlqueue._queue import Queue

__all__ = ["Worker", "WorkerSettings"]

log = logging.getLogger("sqlqueue.worker")

#: How long the claim loop waits for more jobs to finish when only a few slots are free.
_GATHER_SECONDS = 0.001
#: A burst worker whose claim rounds have failed for this long in a row gives up (exit 3).
BURST_PATIENCE_SECONDS = 10.0
#: Tries of a release (at shutdown, or of held jobs) before their leases are left to expire.
_RELEASE_TRIES = 6
#: A job claimed ahead has its start recorded (see ``Store.cycle``) by the first claim round
#: after it has run this long; a quicker one, by its outcome. Recording every start would cost
#: a statement per round; until it is recorded, a reaper would give the attempt back.
RECORD_START_SECONDS = 0.05


class Worker:
    """Runs the jobs of one :class:`~sqlqueue.Queue`; see :meth:`run`."""

    def __init__(
        self,
        queue: Queue,
        settings: WorkerSettings | None = None,
        *,
        metrics_port: int | None = None,
    ) -> None:
        """A worker for ``queue`` (usually made by :meth:`~sqlqueue.Queue.worker`);
        ``metrics_port`` serves Prometheus metrics there (see :class:`WorkerSettings`)."""
        settings = settings or WorkerSettings()
        if metrics_port is not None:
            settings = replace(settings, metrics_port=metrics_port)
        self.queue = queue
        self.settings = settings
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self._tasks = dict(queue.tasks)
        self._slots = Slots.build(
            settings.queues
            or sorted({task.queue for task in self._tasks.values()} | {queue.default_queue}),
            settings.concurrency,
        )
        self._job_types = sorted(self._tasks) if queue.unknown_jobs == "skip" else None
        #: The limits this worker's claims obey: its tasks' ``Concurrency`` limits, and the
        #: queues' limits as last read (see :meth:`_queue_limits_read`).
        self._claim_limits = ClaimLimits(
            tasks={
                name: task.concurrency.limit
                for name, task in self._tasks.items()
                if task.concurrency is not None
            }
        )
        lease = queue.lease_seconds
        self._heartbeat_interval = lease / 3
        self._scheduler_interval = min(settings.poll_interval, 1.0)
        self._reaper_interval = settings.reaper_interval or min(max(lease / 2, 0.5), 30.0)
        self._store = queue.store
        self._reaper = Reaper(queue.store)
        self._scheduler = Scheduler(queue, queue.periodic_schedules)
        self._registration = Registration(
            queue.admin,
            worker_id=self.worker_id,
            queues={name: pool.limit for pool in self._slots.pools for name in pool.queues},
            job_types=self._job_types,
            interval=self._heartbeat_interval,
        )
        self._heartbeat = Heartbeat(
            queue.store, registration=self._registration, lease_seconds=queue.lease_seconds
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        #: The serving loop's ``time`` (event-loop time), read a few times per job.
        self._clock: Callable[[], float] = time.monotonic
        self._stop_requested = asyncio.Event()
        self._force = asyncio.Event()
        self._wake = asyncio.Event()
        self._pending_stop = False
        #: Each running job's task (or, for a plain sync handler, its thread ticket's future).
        self._running: dict[int, asyncio.Future[Any]] = {}
        #: When each running job started (event-loop time): a pool's quick jobs claim ahead.
        self._started_at: dict[int, float] = {}
        self._leased: dict[int, ClaimedJob] = {}
        #: Jobs claimed ahead (their rows have no ``started_at``) and still held, and the
        #: fence and start (event-loop time) of those that started since, until a claim round
        #: or their outcome records the start.
        self._ahead: set[int] = set()
        self._unrecorded: dict[int, tuple[tuple[int, int], float]] = {}
        self._capped = False
        self._db = DatabaseThread()
        self._launcher: Launcher | None = None
        self._contexts: Contexts | None = None
        self._listener: Listener | None = None
        self._served = frozenset(self._slots.queues)
        self._completer: Completer | None = None
        self._upkeep: Upkeep | None = None
        #: The claim round's retries (sqlqueue/_worker/retries.py), and the error a burst
        #: worker gave up on.
        self._claim_backoff = Backoff(self._db.answers)
        self._gave_up: DatabaseError | None = None
        #: The log and the metrics: what this worker tells of each outcome (see observe.py).
        self._observers = Observers(self.worker_id, queue.tracing)
        #: The port metrics are served on, once serving (``metrics_port=0`` picks one).
        self.metrics_port: int | None = None

    # -- lifecycle ----------------------------------------------------------------------------

    def run(self, *, burst: bool = False) -> None:
        """Run until SIGTERM/SIGINT (or, with ``burst``, until no job of a type it has a task
        for is due and none runs).

        The first signal stops claiming and lets in-flight jobs finish for up to
        ``shutdown_timeout`` seconds; jobs still running then are released to the queue without
        burning an attempt. A second signal skips the wait.
        """
        asyncio.run(self._run_with_signals(burst))

    async def _run_with_signals(self, burst: bool) -> None:
        loop = asyncio.get_running_loop()
        handled: list[signal.Signals] = []
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._on_signal, sig)
                handled.append(sig)
        try:
            await self.serve(burst=burst)
        finally:
            for sig in handled:
                loop.remove_signal_handler(sig)

    def stop(self) -> None:
        """Ask the worker to shut down gracefully; safe to call from any thread."""
        loop = self._loop
        if loop is None:
            self._pending_stop = True
            return
        loop.call_soon_threadsafe(self._request_stop)

    def _on_signal(self, sig: signal.Signals) -> None:
        if self._stop_requested.is_set():
            log.warning("received %s again: releasing in-flight jobs now", sig.name)
            self._force.set()
            return
        log.warning(
            "received %s: no new claims; in-flight jobs get %.0f s to finish "
            "(send it again to stop now)",
            sig.name,
            self.settings.shutdown_timeout,
        )
        self._request_stop()

    def _request_stop(self) -> None:
        if self._upkeep is not None and not self._stop_requested.is_set():
            self._upkeep.stopping_now()
        self._stop_requested.set()
        self._wake.set()
        if self._contexts is not None:
            self._contexts.cancel_all()

    async def serve(self, *, burst: bool = False) -> None:
        """The worker as a coroutine, for running inside an existing event loop. Refuses to
        start (:class:`~sqlqueue.ConfigurationError`) on a queue with no task: it could run
        nothing, and jobs stay queued for workers that know their types."""
        if not self._tasks:
            raise ConfigurationError(
                "no task is registered on this Queue, so its worker could run nothing: import "
                "the modules that declare the tasks (@queue.task) before starting the worker"
            )
        self._loop = asyncio.get_running_loop()
        self._clock = self._loop.time
        self._stop_requested = asyncio.Event()
        self._force = asyncio.Event()
        self._wake = asyncio.Event()
        if self._pending_stop:
            self._stop_requested.set()
        self._running = {}
        self._started_at = {}
        self._leased = {}
        self._ahead = set()
        self._unrecorded = {}
        self._capped = False
        self._db = DatabaseThread(self.worker_id)
        self._claim_backoff = Backoff(self._db.answers)
        self._gave_up = None
        threads = HandlerThreads(self._slots.total, worker_id=self.worker_id)
        scope = current_worker.set(self.worker_id)  # the loop's records carry the worker's id
        contexts = self._contexts = Contexts(
            self.queue,
            self._store,
            lease_seconds=self.queue.lease_seconds,
            worker_id=self.worker_id,
            db=self._db,
        )
        runtime = Runtime(
            threads=threads,
            store=self._store,
            worker_id=self.worker_id,
            known=sorted(self._tasks),
            max_result_bytes=self.queue.max_result_bytes,
            make_context=contexts.make,
            forget_context=contexts.forget,
            db=self._db,
            capped_queues=lambda: self._claim_limits.queues,
        )
        completer = self._completer = Completer(
            self._store,
            self._db,
            self.worker_id,
            on_written=self._on_written,
            on_added=self._wake.set,
            backoff=Backoff(self._db.answers),
            on_written_alone=self._written_alone,
        )
        self._launcher = Launcher(self._tasks, runtime, completer, ended=self._finished)
        log.info(
            "worker %s serving queues %s; lease %.1f s",
            self.worker_id,
            self._slots.describe(),
            self.queue.lease_seconds,
        )
        used = {task.queue for task in self._tasks.values()} | self.queue._enqueued_elsewhere
        for name in [name for name in self.settings.queues or () if name not in used]:
            log.warning(  # a typo in --queues would otherwise serve an empty queue in silence
                "no registered task uses the queue %r (its tasks' queues: %s); it is served "
                "only for jobs enqueued with queue=%r",
                name,
                ", ".join(sorted(used)),
                name,
            )
        loop = self._loop
        listener = self._listener = Listener(
            self.queue.engine,
            self.queue.dialect,
            lambda queue_name: loop.call_soon_threadsafe(self._woken_for, queue_name),
        )
        upkeep = self._upkeep = Upkeep(
            self.queue.admin,
            self._db,
            retention=self.queue.retention,
            single_writer=self.queue.dialect.single_writer,
            worker_id=self.worker_id,
            served=self._served,
            poll_interval=self.settings.poll_interval,
            on_resumed=self._resumed,
            registration=self._registration,
            running=lambda: len(self._running),
            on_limits=self._queue_limits_read,
        )
        try:
            self.metrics_port = self._observers.start(
                self.settings, self.queue.stats, self.queue._meter_calls
            )
            await upkeep.read_paused(strict=burst)
        except (DatabaseError, ConfigurationError):
            self._stop_observers()
            self._db.close()
            threads.shutdown()
            self._loop = None
            current_worker.reset(scope)
            raise
        if not burst and self.settings.listen:
            listener.start()
        elif not self.settings.listen:
            log.info("wake-ups off (listen=False): polling every %g s", self.settings.poll_interval)
        duties = [
            asyncio.create_task(contexts.run(), name="sqlqueue-progress"),
            asyncio.create_task(completer.run(), name="sqlqueue-completer"),
            asyncio.create_task(
                every(
                    self._heartbeat_interval,
                    self._beat,
                    "heartbeat",
                    answers=self._db.answers,
                    at_once=True,  # the worker's row, at once
                ),
                name="sqlqueue-heartbeat",
            ),
            asyncio.create_task(
                every(
                    self._reaper_interval, self._reap_once, "reaper pass", answers=self._db.answers
                ),
                name="sqlqueue-reaper",
            ),
            asyncio.create_task(
                every(
                    self._scheduler_interval,
                    self._schedule_once,
                    "scheduler pass",
                    answers=self._db.answers,
                ),
                name="sqlqueue-scheduler",
            ),
        ]
        duties += upkeep.start(self._stop_requested.is_set)
        probe = None
        if self.queue.dialect.supports_claim_floor:
            probe = FloorProbe(self._store, self.worker_id, self._floor_lowered)
            duties.append(probe.start())
        try:
            await self._claim_loop(burst)
            await self._shut_down()
        finally:
            for duty in duties:
                duty.cancel()
            await asyncio.gather(*duties, return_exceptions=True)
            await upkeep.stop()
            await asyncio.to_thread(listener.stop)
            threads.shutdown()
            if probe is not None:
                probe.close()
            self._db.close()
            self._loop = None
            self._stop_observers()
            await self._close_async_connections()
            log.info("worker %s stopped", self.worker_id)
            current_worker.reset(scope)
        if self._gave_up is not None:
            raise self._gave_up

    async def _close_async_connections(self) -> None:
        """Async handlers' pooled connections belong to this loop, which may end with serve():
        close them on it (see ``Queue._close_async_connections``); a failure to is logged."""
        try:
            await self.queue._close_async_connections()
        except Exception:
            log.warning("could not close the async handlers' pooled connections", exc_info=True)

    def _stop_observers(self) -> None:
        self._observers.stop()
        self.metrics_port = None

    @property
    def listening(self) -> bool:
        """Whether wake-ups (PostgreSQL LISTEN) currently reach this worker."""
        return self._listener is not None and self._listener.connected.is_set()

    def _floor_lowered(self) -> None:
        """The floor probe found a job before a claim floor: claim now, not at the next poll."""
        self._slots.wake()
        self._wake.set()

    def _woken_for(self, queue_name: str) -> None:
        if queue_name == PAUSES_CHANGED:
            if self._upkeep is not None:
                self._upkeep.pauses_changed()
            return
        if queue_name in self._served:
            self._slots.wake([queue_name])
            self._wake.set()

    # -- claiming -----------------------------------------------------------------------------

    async def _claim_loop(self, burst: bool) -> None:
        """Each round: write the outcomes finished since the last round and claim jobs for the
        free slots, in one transaction; sleep when there is neither (until a job finishes, a
        wake-up arrives or a resting pool's poll interval is over).

        A failed round is tried again within tens of milliseconds (sqlqueue/_worker/retries.py)
        and its outcomes go to the completer to write on their own meanwhile, so a failing claim
        does not hold them back, nor they the claim. A burst worker whose rounds keep failing for
        ``BURST_PATIENCE_SECONDS`` stops and :meth:`serve` raises the error."""
        completer = self._require_completer()
        backoff = self._claim_backoff
        failing_since = 0.0
        while not self._stop_requested.is_set():
            await self._gather()
            batch = completer.take()
            # A finished job may make others claimable at once (its group's next job, a freed
            # rate-limit token): its queue's pool claims in this round, resting or not.
            self._slots.wake(outcome.job.queue for outcome in batch)
            stuck = self._slots.take_stuck(asyncio.get_running_loop().time())
            if stuck:  # held behind slow jobs: let another worker have them
                await self._release(stuck, shutdown=False)
            wanted = self._wanted_claims()
            now = asyncio.get_running_loop().time()
            finished = {outcome.job.id for outcome in batch}
            started, record_in = self._starts_to_record(now, finished)
            if not batch and not wanted and not started:
                idle = not self._running and not self._slots.held
                if burst and idle and completer.idle and backoff.failures == 0:
                    if not await self._anything_due():
                        return
                    continue
                claim_in = self._slots.next_claim_in(now, self.settings.poll_interval)
                await self._sleep(min(claim_in, record_in))
                continue
            claims = self._split(wanted)
            standby = self._standby(batch, wanted)
            try:
                landed, claimed = await self._db.call(
                    partial(self._cycle, batch, claims, started, standby)
                )
            except DatabaseError as error:
                completer.put_back(batch)
                completer.write_alone()
                now = asyncio.get_running_loop().time()
                failing_since = now if backoff.failures == 0 else failing_since
                delay = backoff.failed()
                what = "claim jobs" if claims else f"record {len(batch)} job outcome(s)"
                if burst and now - failing_since >= BURST_PATIENCE_SECONDS:
                    log.error(
                        "cannot %s for %.0f s: %s; a burst worker stops",
                        what,
                        now - failing_since,
                        error,
                    )
                    self._gave_up = error
                    return
                log.error("cannot %s: %s; retrying in %.3f s", what, error, delay)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop_requested.wait(), delay)
                continue
            except BaseException:
                completer.put_back(batch)  # kept for the completer's own writes at shutdown
                raise
            backoff.succeeded()
            completer.settle(batch, landed)
            for job_id, attempt in started:
                self._forget_start(job_id, attempt)
            if self._stop_requested.is_set():
                await self._release([job for jobs in claimed for job in jobs])
                return
            rest_until = asyncio.get_running_loop().time() + self.settings.poll_interval
            got: dict[Pool, int] = {}
            for (pool, _, ahead), jobs in zip(claims, claimed[: len(claims)], strict=True):
                got[pool] = got.get(pool, 0) + len(jobs)
                for job in jobs:
                    self._start_or_hold(job, pool, ahead=ahead)
            for pool, jobs in zip(standby, claimed[len(claims) :], strict=True):
                for job in jobs:
                    self._start_or_hold(job, pool)
            for pool, count in wanted:
                if got.get(pool, 0) < count:
                    pool.rest_until = rest_until

    async def _gather(self) -> None:
        """Slots just freed while others still run: let more finish first (for at most
        ``_GATHER_SECONDS``), so one commit carries a batch rather than a job — short jobs end
        microseconds apart."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _GATHER_SECONDS
        while self._running and 0 < self._slots.free < self._slots.total:
            remaining = deadline - loop.time()
            if remaining <= 0 or self._stop_requested.is_set():
                return
            self._wake.clear()
            await self._sleep(remaining)

    def _wanted_claims(self) -> list[tuple[Pool, int]]:
        """How many jobs to claim for which pool now (its free slots, and a batch ahead while its
        jobs are quick: see ``Pool.wanted``), unless it is resting or every queue of it is
        paused."""
        # Outcome writes lag behind: stop claiming until they catch up.
        self._capped = len(self._leased) >= 2 * self._slots.total + self._slots.ahead
        if self._stop_requested.is_set() or self._capped:
            return []
        now = asyncio.get_running_loop().time()
        wanted = []
        for pool, count in self._slots.claimable(now):
            if self._active(pool):
                wanted.append((pool, count))
            else:  # rests until resumed (a pause re-read wakes it) or its next poll
                pool.rest_until = now + self.settings.poll_interval
        return wanted

    def _starts_to_record(
        self, now: float, finished: Set[int]
    ) -> tuple[list[tuple[int, int]], float]:
        """The fences of jobs claimed ahead that have run ``RECORD_START_SECONDS`` unrecorded
        (those ``finished`` record theirs with their outcome), and the seconds until the next
        one has."""
        due: list[tuple[int, int]] = []
        wait = float("inf")
        for job_id, (fence, started) in self._unrecorded.items():
            if job_id in finished:
                continue
            left = started + RECORD_START_SECONDS - now
            if left <= 0:
                due.append(fence)
            else:
                wait = min(wait, left)
        return due, wait

    def _forget_start(self, job_id: int, attempt: int) -> None:
        """The start of ``job_id``'s attempt is recorded (by a round, or its outcome)."""
        known = self._unrecorded.get(job_id)
        if known is not None and known[0] == (job_id, attempt):
            del self._unrecorded[job_id]

    def _split(self, wanted: list[tuple[Pool, int]]) -> list[tuple[Pool, int, bool]]:
        """The claims of a round: per pool, the jobs for its free slots, and those it claims
        ahead to hold (leased without a start: see ``Claiming.claim_statement``)."""
        claims = []
        for pool, count in wanted:
            now = min(count, pool.free)
            if now:
                claims.append((pool, now, False))
            if count > now:
                claims.append((pool, count - now, True))
        return claims

    def _standby(self, batch: Sequence[Outcome], wanted: list[tuple[Pool, int]]) -> list[Pool]:
        """The pools with free slots that do not claim in this round, when an outcome of it
        ends a child of a batch or a workflow: the round claims for them only if it releases
        a step (or enqueues a callback) in one of their queues (see ``Store.cycle``), so a
        released step starts in that round, in any queue, and otherwise nothing is sent."""
        if not any(outcome.job.batch_id is not None for outcome in batch):
            return []
        if self._stop_requested.is_set():
            return []
        if self._capped:
            # No claim in this round: the next ones claim for every pool, in case this one
            # releases a step or enqueues a callback in a resting pool's queue.
            self._slots.wake()
            return []
        claiming = {id(pool) for pool, _ in wanted}
        return [
            pool
            for pool in self._slots.with_free_slots()
            if id(pool) not in claiming and self._active(pool)
        ]

    def _active(self, pool: Pool) -> tuple[str, ...]:
        """The queues of ``pool`` that are not paused."""
        return self._upkeep.pauses.active(pool.queues) if self._upkeep else pool.queues

    def _cycle(
        self,
        batch: list[Outcome],
        claims: list[tuple[Pool, int, bool]],
        started: Sequence[tuple[int, int]] = (),
        standby: Sequence[Pool] = (),
    ) -> tuple[set[int], list[list[ClaimedJob]]]:
        succeeded, failures, results = outcome_fields(batch)
        return self._store.cycle(
            worker_id=self.worker_id,
            succeeded=succeeded,
            failures=failures,
            results=results,
            claims=[(self._active(pool), count) for pool, count, _ in claims],
            ahead=[ahead for _, _, ahead in claims],
            started=started,
            job_types=self._job_types,
            lease_seconds=self.queue.lease_seconds,
            limits=self._claim_limits,
            standby=[(self._active(pool), pool.free) for pool in standby],
            batch_ids=succeeded_batches(batch),
        )

    async def _anything_due(self) -> bool:
        """Burst mode's last look: recover expired leases, then claim once more (a retry may
        have become due meanwhile)."""
        wanted = [pool for pool in self._slots.with_free_slots() if self._active(pool)]
        # From the head of the claim index: a job that sorts before a claim floor is due too.
        self._store.claim_floors.reset()
        try:
            await self._db.call(self._reaper.run_once)
            claims = [(pool, pool.free, False) for pool in wanted]
            _, claimed = await self._db.call(partial(self._cycle, [], claims))
        except DatabaseError:
            self._slots.wake()  # not known to be empty: the next round meets the outage
            return True  # and backs off
        for pool, jobs in zip(wanted, claimed, strict=True):
            for job in jobs:
                self._start(job, pool, self._clock())
        if any(claimed):
            self._slots.wake()
            return True
        return False

    async def _sleep(self, seconds: float) -> None:
        """Sleep until woken (a slot freed, a stop) or ``seconds`` pass."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), seconds)
        self._wake.clear()

    # -- running jobs -------------------------------------------------------------------------

    def _start_or_hold(self, job: ClaimedJob, pool: Pool, *, ahead: bool = False) -> None:
        """Start ``job`` in a free slot of ``pool``, or hold it (leased, heartbeaten, released
        at shutdown) until one frees. A job claimed ``ahead`` has no start in its row until
        the next round records it."""
        known = self._leased.get(job.id)
        if known is not None and known.fence == job.fence:
            # Reaped unstarted and claimed again by us under the same fence while our copy
            # still runs or is held: that copy is this claim's run.
            return
        if ahead:
            self._ahead.add(job.id)
        now = self._clock()
        if pool.free > 0:
            self._start(job, pool, now)
        else:
            self._leased[job.id] = job
            pool.hold(job, now)

    def _start(self, job: ClaimedJob, pool: Pool, now: float) -> None:
        """Start ``job`` in a free slot of ``pool`` at ``now`` (event-loop time)."""
        if self._launcher is None:  # pragma: no cover - serve() sets it before any claim
            raise RuntimeError("the worker is not serving")
        if job.id in self._ahead:
            self._ahead.discard(job.id)
            self._unrecorded[job.id] = (job.fence, now)
        self._slots.take(pool, job.id)
        self._leased[job.id] = job
        self._started_at[job.id] = now
        self._running[job.id] = self._launcher.launch(job)

    def _require_completer(self) -> Completer:
        if self._completer is None:  # pragma: no cover - serve() sets it before any job runs
            raise RuntimeError("the worker is not serving")
        return self._completer

    def _finished(self, job: ClaimedJob, running: asyncio.Future[Any]) -> None:
        # Only if it is still this attempt's: after a reaper took our stalled attempt's lease
        # we may have claimed the job again, and that attempt keeps its slot.
        if self._running.get(job.id) is running:
            del self._running[job.id]
            pool = self._slots.give_back(job.id)
            started_at = self._started_at.pop(job.id, None)
            now = self._clock()
            if pool is not None and started_at is not None:
                pool.ran(now - started_at)
            if pool is not None and pool.held and not self._stop_requested.is_set():
                # Its slot, without a round trip.
                self._start(pool.next_held(now), pool, now)
        self._wake.set()  # a slot is free, or a held job started: the pool may claim ahead

    def _on_written(self, outcome: Outcome, landed: bool) -> None:
        leased = self._leased.get(outcome.job.id)
        if leased is not None and leased.attempt == outcome.job.attempt:  # not a newer attempt
            del self._leased[outcome.job.id]
        self._forget_start(outcome.job.id, outcome.job.attempt)
        if self._capped:
            self._wake.set()  # the claim loop may be waiting for leases to drop below its cap
        if outcome.recorded and (outcome.claimable or outcome.job.batch_id is not None):
            # Its handler's transaction ended it, and may have released workflow steps,
            # enqueued a batch's callback, or added children or steps (``ctx.add_to_batch``,
            # ``ctx.add_to_workflow``: queued at once, in any queue, and not in
            # ``claimable``): the next round claims for every pool, none waits for its poll
            # (no wake-up reaches a worker on SQLite or MariaDB, or without LISTEN).
            self._slots.wake()
            self._wake.set()
        self._observers.written(outcome, landed)

    def _written_alone(self, batch: list[Outcome]) -> None:
        """The completer wrote ``batch`` on its own (a round had failed): what its batches'
        and workflows' settling made claimable, no round saw, so every pool claims next."""
        if any(outcome.job.batch_id is not None for outcome in batch):
            self._slots.wake()
            self._wake.set()

    # -- maintenance duties -------------------------------------------------------------------

    async def _beat(self) -> None:
        jobs = list(self._leased.values())  # a snapshot, taken on the loop
        held = self._slots.held_ids()
        beat = await self._db.call(
            partial(
                self._heartbeat.run_once,
                jobs,
                still_running=lambda job_id: job_id in self._running or job_id in held,
                running=len(self._running),
                stopping=self._stop_requested.is_set(),
            )
        )
        # A held job whose lease was lost was reaped and may run elsewhere: never start it.
        for job_id in self._slots.drop_held(beat.lost):
            self._leased.pop(job_id, None)
            self._ahead.discard(job_id)
        if beat.cancel_requested and self._contexts is not None:
            for job_id in beat.cancel_requested:
                self._contexts.cancel(job_id)
        if beat.cancel_requested:
            self._observers.cancel_requested(beat.cancel_requested)

    async def _reap_once(self) -> None:
        await self._db.call(self._reaper.run_once)

    def _queue_limits_read(self, limits: Mapping[str, int]) -> None:
        """The queues' limits of running jobs were read: claims obey them from now on (with
        the tasks' ``Concurrency`` limits, see ``_store/limited_claim.py``)."""
        self._claim_limits = replace(self._claim_limits, queues=dict(limits))

    def _resumed(self, queues: frozenset[str]) -> None:
        """Paused queues were resumed: their pools may claim at once."""
        self._slots.wake(queues)
        self._wake.set()

    async def _schedule_once(self) -> None:
        if self.queue.periodic_schedules:
            await self._db.call(self._scheduler.run_once)

    # -- shutdown -----------------------------------------------------------------------------

    async def _shut_down(self) -> None:
        self._require_completer().take_over()
        await self._release(self._slots.take_held())  # never started: back to the queue now
        running = list(self._running.values())
        if running:
            force = asyncio.create_task(self._force.wait())
            await self._wait_for_running(running, force)
            force.cancel()
        unfinished = [self._leased[job_id] for job_id in self._running if job_id in self._leased]
        for running_job in list(self._running.values()):
            running_job.cancel()
        await asyncio.gather(*self._running.values(), return_exceptions=True)
        try:
            await asyncio.wait_for(
                self._require_completer().wait_idle(), self.settings.shutdown_timeout + 5
            )
        except TimeoutError:
            log.error("could not record every outcome before stopping; their leases will expire")
        await self._release(unfinished)

    async def _wait_for_running(
        self, running: Sequence[asyncio.Future[Any]], force: asyncio.Task[Any]
    ) -> None:
        """Until every running job is done, a second signal arrives, or the grace is over."""
        all_done = asyncio.gather(*running, return_exceptions=True)
        await asyncio.wait(
            {all_done, force}, timeout=self.settings.shutdown_timeout, return_when="FIRST_COMPLETED"
        )

    async def _release(self, jobs: Sequence[ClaimedJob], *, shutdown: bool = True) -> None:
        """Give ``jobs`` (leased, never started) back to the queue without using an attempt:
        at shutdown, or (``shutdown=False``) held jobs a pool of slow jobs could not start."""
        if not jobs:
            return
        fences = [job.fence for job in jobs]
        try:
            released = await retry_quickly(
                lambda: self._db.call(
                    lambda: self._store.release(worker_id=self.worker_id, fences=fences)
                ),
                Backoff(self._db.answers),
                tries=_RELEASE_TRIES,
                what=f"releasing {len(jobs)} job(s)",
                sleep=asyncio.sleep,
            )
        except DatabaseError as error:
            log.error("could not release %d job(s): %s; their leases will expire", len(jobs), error)
            released = set()
        self._observers.released(jobs)
        for job in jobs:  # no longer heartbeaten: released, or left for their leases to expire
            self._leased.pop(job.id, None)
            self._ahead.discard(job.id)
        if not released:
            return
        if shutdown:
            log.warning(
                "released %d unfinished job(s) back to the queue without using an attempt: %s",
                len(released),
                sorted(released),
            )
        else:
            log.info(
                "gave %d job(s) claimed ahead back to the queue: every slot is taken by slower "
                "jobs; claiming ahead stops until jobs are quick again: %s",
                len(released),
                sorted(released),
            )
