"""A worker's duties for the operators: follow pauses, fold finished jobs into the stats'
counts, cancel expired jobs, prune by the queue's retention — each a periodic task beside
the claim loop, its SQL run on the worker's database thread between claims — and say in its
row of the live workers' table that it is stopping, then delete the row (the heartbeat
writes it otherwise)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from sqlqueue._errors import DatabaseError
from sqlqueue._policies.retention import Retention
from sqlqueue._worker.dbthread import DatabaseThread
from sqlqueue._worker.pauses import Pauses
from sqlqueue._worker.registry import Registration
from sqlqueue._worker.retention import RetentionDuty
from sqlqueue._worker.retries import Answers, Backoff

if TYPE_CHECKING:
    from sqlqueue._store.admin import Admin

__all__ = ["EXPIRE_SECONDS", "FOLD_SECONDS", "Upkeep", "every"]

log = logging.getLogger("sqlqueue.worker")

#: How often a worker folds newly finished jobs into the stats' rollup (see _store/counts.py).
FOLD_SECONDS = 60.0
#: How often a worker cancels waiting jobs past their expiry (claims skip them meanwhile).
EXPIRE_SECONDS = 5.0


async def every(
    interval: float,
    duty: Callable[[], Awaitable[object]],
    name: str,
    *,
    answers: Answers,
    at_once: bool = False,
) -> None:
    """Run ``duty`` every ``interval`` seconds (±10 %), for ever (``at_once``: first right
    away). A database error is logged and the duty tried again soon (sqlqueue/_worker/
    retries.py: tens of milliseconds, doubling, never later than its next turn), so a
    passing fault never costs a heartbeat its turn."""
    backoff = Backoff(answers)
    wait = 0.0 if at_once else interval * random.uniform(0.9, 1.1)
    while True:
        if wait > 0:
            await asyncio.sleep(wait)
        try:
            await duty()
        except DatabaseError as error:
            wait = min(backoff.failed(), interval)
            log.warning("%s failed: %s; retrying in %.3f s", name, error, wait)
            continue
        backoff.succeeded()
        wait = interval * random.uniform(0.9, 1.1)


class Upkeep:
    """Pauses, count folding and retention for one worker (see the module docstring)."""

    def __init__(
        self,
        admin: Admin,
        db: DatabaseThread,
        *,
        retention: Retention | None,
        single_writer: bool,
        worker_id: str,
        served: Iterable[str],
        poll_interval: float,
        on_resumed: Callable[[frozenset[str]], None],
        registration: Registration,
        running: Callable[[], int],
        on_limits: Callable[[Mapping[str, int]], None] = lambda _: None,
    ) -> None:
        self._admin = admin
        self._registration = registration
        self._running = running
        self._db = db
        self._poll_interval = poll_interval
        self._on_resumed = on_resumed
        self._single_writer = single_writer
        self.pauses = Pauses(admin, served, on_limits)
        self._reading: asyncio.Future[None] | None = None
        self._stopping: asyncio.Future[None] | None = None
        retention = Retention() if retention is None else retention  # gone workers' rows
        self._retention = (
            RetentionDuty(admin, retention, holder=worker_id, single_writer=single_writer)
            if any(retention.ages()) or retention.gone_workers is not None
            else None
        )

    async def read_paused(self, *, strict: bool = False) -> None:
        """Re-read which queues are paused. ``strict`` (a burst worker's first read): a database
        that is unreachable or not migrated stops the worker instead of being waited for."""
        try:
            change = await self._db.call(self.pauses.read)
        except DatabaseError as error:
            if strict:
                raise
            self.pauses.failed(error)
            return
        resumed = self.pauses.update(change)
        if resumed:
            self._on_resumed(resumed)

    def pauses_changed(self) -> None:
        """A wake-up said an operator paused or resumed a queue: re-read now (on the loop)."""
        self._reading = asyncio.ensure_future(self.read_paused())

    async def fold_counts(self) -> None:
        """Count jobs finished since the last fold into the stats' rollup, so ``stats()`` reads
        at most a minute or so of finished jobs row by row: a window per database call until
        caught up (a first fold of a long history takes several), with a gap after each on a
        single-writer database so other processes' claims get the lock."""
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            fold = await self._db.call(self._admin.fold_counts)
            if fold.caught_up:
                return
            if self._single_writer:
                await asyncio.sleep(min(loop.time() - started, 0.2))

    async def expire_jobs(self) -> None:
        """Cancel expired waiting jobs (reason ``expired``), a batch per database call until
        none is left, with a gap after each on a single-writer database."""
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            if await self._db.call(self._admin.expire_jobs) == 0:
                return
            if self._single_writer:
                await asyncio.sleep(min(loop.time() - started, 0.2))

    def stopping_now(self) -> None:
        """The worker began to shut down: say so in its row at once (on the loop), so operators
        see it stopping while its last jobs finish."""

        running = self._running()

        async def announce() -> None:
            with contextlib.suppress(DatabaseError):
                await self._db.call(
                    lambda: self._registration.announce(running=running, stopping=True)
                )

        self._stopping = asyncio.ensure_future(announce())

    def start(self, stopping: Callable[[], bool]) -> list[asyncio.Task[None]]:
        """The periodic tasks; ``stopping`` ends a retention pass early."""

        tasks = [
            asyncio.create_task(
                every(
                    self._poll_interval,
                    self.read_paused,
                    "paused-queues read",
                    answers=self._db.answers,
                ),
                name="sqlqueue-pauses",
            ),
            asyncio.create_task(
                every(
                    FOLD_SECONDS,
                    self.fold_counts,
                    "finished-count fold",
                    answers=self._db.answers,
                    at_once=True,
                ),
                name="sqlqueue-counts",
            ),
            asyncio.create_task(
                every(
                    EXPIRE_SECONDS,
                    self.expire_jobs,
                    "expired-job cancel",
                    answers=self._db.answers,
                    at_once=True,
                ),
                name="sqlqueue-expiry",
            ),
        ]
        retention = self._retention
        if retention is not None:

            async def retain() -> None:
                await retention.run_pass(self._db, stopping)

            tasks.append(
                asyncio.create_task(
                    every(
                        retention.retention.interval,
                        retain,
                        "retention",
                        answers=self._db.answers,
                    ),
                    name="sqlqueue-retention",
                )
            )
        return tasks

    async def stop(self) -> None:
        """Leave the live workers' table, and give up the retention duty, so another worker
        takes it at its next pass."""
        if self._stopping is not None:  # written before the row goes, never after
            await asyncio.gather(self._stopping, return_exceptions=True)
        with contextlib.suppress(DatabaseError):
            await self._db.call(self._registration.withdraw)
        if self._retention is not None:
            with contextlib.suppress(DatabaseError):
                await self._db.call(self._retention.release)
