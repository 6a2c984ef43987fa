"""Writing attempt outcomes in batches: everything finished since the last write, at once.

While the worker claims, its claim loop takes the pending outcomes into each claim's
transaction (:meth:`Completer.take` / :meth:`Completer.settle`), so a busy worker pays one
commit for a batch of outcomes and the next batch of jobs. Once the worker stops claiming
(shutdown), :meth:`Completer.run` writes them on its own. Outcomes survive a database outage:
they stay queued and are written when the database answers again (their fence makes a late
write harmless).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from functools import partial
from typing import Any

from sqlqueue._errors import DatabaseError
from sqlqueue._store.rows import Failure
from sqlqueue._store.store import Store
from sqlqueue._worker.classify import Outcome
from sqlqueue._worker.dbthread import DatabaseThread

__all__ = ["Completer", "outcome_fields"]

log = logging.getLogger("sqlqueue.worker")


class Completer:
    """Collects outcomes; hands them out in batches and reports each once it is written."""

    def __init__(
        self,
        store: Store,
        db: DatabaseThread,
        worker_id: str,
        *,
        on_written: Callable[[Outcome, bool], None],
        on_added: Callable[[], None],
        retry_delay: Callable[[int], float],
    ) -> None:
        self._store = store
        self._db = db
        self._worker_id = worker_id
        self._on_written = on_written
        self._on_added = on_added
        self._retry_delay = retry_delay
        self._pending: list[Outcome] = []
        self._in_flight = 0
        self._alone = False
        self._ready = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()

    def add(self, outcome: Outcome) -> None:
        """Queue an outcome for the next batch (one written by its handler is reported at once)."""
        if outcome.recorded:
            self._on_written(outcome, outcome.landed)
            return
        self._pending.append(outcome)
        self._idle.clear()
        if self._alone:
            self._ready.set()
        self._on_added()

    def take(self) -> list[Outcome]:
        """The next batch to write (at most one outcome per job); report it with
        :meth:`settle`, or hand it back with :meth:`put_back` if the write failed."""
        batch, self._pending = _one_attempt_per_job(self._pending)
        if batch:
            self._in_flight += 1
        return batch

    def settle(self, batch: list[Outcome], landed: set[int]) -> None:
        """``batch`` was written; ``landed`` are the job ids whose lease was still ours."""
        if not batch:
            return
        self._in_flight -= 1
        for outcome in batch:
            self._on_written(outcome, outcome.job.id in landed)
        self._settled()

    def put_back(self, batch: list[Outcome]) -> None:
        """Writing ``batch`` failed: it goes first into the next one."""
        if not batch:
            return
        self._in_flight -= 1
        self._pending[:0] = batch
        self._settled()

    def _settled(self) -> None:
        if self._pending:
            self._ready.set()
        elif self._in_flight == 0:
            self._idle.set()

    @property
    def idle(self) -> bool:
        """Whether every outcome added so far has been written."""
        return self._idle.is_set()

    async def wait_idle(self) -> None:
        """Wait until every outcome added so far has been written."""
        await self._idle.wait()

    def take_over(self) -> None:
        """From now on :meth:`run` writes the outcomes: the claim loop has stopped."""
        self._alone = True
        self._ready.set()

    async def run(self) -> None:
        """Once taken over, write batches until cancelled."""
        failures_in_a_row = 0
        while True:
            await self._ready.wait()
            self._ready.clear()
            if not self._alone:
                continue
            batch = self.take()
            if not batch:
                continue
            try:
                landed = await self._db.call(partial(self._write, batch))
            except DatabaseError as error:
                failures_in_a_row += 1
                delay = self._retry_delay(failures_in_a_row)
                log.warning(
                    "could not record %d job outcome(s): %s; retrying in %.1f s",
                    len(batch),
                    error,
                    delay,
                )
                self.put_back(batch)
                await asyncio.sleep(delay)
                self._ready.set()
                continue
            failures_in_a_row = 0
            self.settle(batch, landed)

    def _write(self, batch: list[Outcome]) -> set[int]:
        succeeded, failures, results = outcome_fields(batch)
        return self._store.finish(
            worker_id=self._worker_id, succeeded=succeeded, failures=failures, results=results
        )


def outcome_fields(
    batch: list[Outcome],
) -> tuple[list[tuple[int, int]], list[Failure], dict[int, Any]]:
    """A batch as the store writes it: succeeded fences, failures, results by job id."""
    return (
        [o.job.fence for o in batch if o.failure is None],
        [o.failure for o in batch if o.failure is not None],
        {o.job.id: o.result for o in batch if o.result is not None},
    )


def _one_attempt_per_job(pending: list[Outcome]) -> tuple[list[Outcome], list[Outcome]]:
    """Split ``pending`` into a batch with at most one outcome per job, and the rest.

    A worker can hold two attempts of one job: its stalled attempt, whose lease the reaper took,
    and its own re-claim of the job. A batch matches outcomes to rows (and results) by job id,
    so in one batch the stale attempt would pass for the landed one and its result overwrite it.
    """
    batch: list[Outcome] = []
    later: list[Outcome] = []
    seen: set[int] = set()
    for outcome in pending:
        (later if outcome.job.id in seen else batch).append(outcome)
        seen.add(outcome.job.id)
    return batch, later
