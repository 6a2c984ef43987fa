"""Writing attempt outcomes in batches: one transaction for everything finished since the last.

While one batch is being written, new outcomes gather for the next, so a busy worker writes
many completions per commit and an idle one writes each at once. Outcomes survive a database
outage: they stay queued and are written when the database answers again (their fence makes a
late write harmless).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from functools import partial

from sqlqueue._dbthread import DatabaseThread
from sqlqueue._errors import DatabaseError
from sqlqueue._executor import Outcome
from sqlqueue._store._tx import Store

__all__ = ["Completer"]

log = logging.getLogger("sqlqueue.worker")


class Completer:
    """Collects outcomes and writes them with :meth:`Store.finish`."""

    def __init__(
        self,
        store: Store,
        db: DatabaseThread,
        worker_id: str,
        *,
        on_written: Callable[[Outcome, bool], None],
        retry_delay: Callable[[int], float],
    ) -> None:
        self._store = store
        self._db = db
        self._worker_id = worker_id
        self._on_written = on_written
        self._retry_delay = retry_delay
        self._pending: list[Outcome] = []
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
        self._ready.set()

    @property
    def idle(self) -> bool:
        """Whether every outcome added so far has been written."""
        return self._idle.is_set()

    async def wait_idle(self) -> None:
        """Wait until every outcome added so far has been written."""
        await self._idle.wait()

    async def run(self) -> None:
        """Write batches until cancelled."""
        failures_in_a_row = 0
        while True:
            await self._ready.wait()
            self._ready.clear()
            batch, self._pending = _one_attempt_per_job(self._pending)
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
                self._pending[:0] = batch
                await asyncio.sleep(delay)
                self._ready.set()
                continue
            failures_in_a_row = 0
            for outcome in batch:
                self._on_written(outcome, outcome.job.id in landed)
            if self._pending:
                self._ready.set()
            else:
                self._idle.set()

    def _write(self, batch: list[Outcome]) -> set[int]:
        return self._store.finish(
            worker_id=self._worker_id,
            succeeded=[o.job.fence for o in batch if o.failure is None],
            failures=[o.failure for o in batch if o.failure is not None],
            results={o.job.id: o.result for o in batch if o.result is not None},
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
