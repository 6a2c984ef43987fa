"""Writing attempt outcomes in batches: everything finished since the last write, at once.

While the worker claims, its claim loop takes the pending outcomes into each claim's
transaction (:meth:`Completer.take` / :meth:`Completer.settle`), so a busy worker pays one
commit for a batch of outcomes and the next batch of jobs. Once the worker stops claiming
(shutdown), :meth:`Completer.run` writes them on its own. Outcomes survive a database outage:
they stay queued and are written when the database answers again (their fence makes a late
write harmless).

When a round's transaction fails, its outcomes are not held hostage by the claim (nor the
claim by them): :meth:`Completer.write_alone` has :meth:`Completer.run` write them in their own
transactions, retried within tens of milliseconds (sqlqueue/_worker/retries.py) and in halves
after each failure (so one failing statement throws away less), while the claim loop claims
on; once they are written the claim loop carries the outcomes again.

An outcome the database refuses for its values (``DatabaseRefused``: a value out of range, a
character it cannot store) would fail that way for ever, its job's lease renewed by the
heartbeat all along. Once the halving has it alone and refused three times in a row, a
substitute failure that names the refusal is written in its place
(:func:`~sqlqueue._worker.classify.unstorable`), and the worker goes on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from functools import partial
from typing import Any

from sqlqueue._errors import DatabaseError, DatabaseRefused
from sqlqueue._store.rows import Failure
from sqlqueue._store.store import Store
from sqlqueue._worker.classify import Outcome, unstorable
from sqlqueue._worker.dbthread import DatabaseThread
from sqlqueue._worker.retries import Backoff

__all__ = ["REFUSALS_BEFORE_SUBSTITUTE", "Completer", "outcome_fields", "succeeded_batches"]

log = logging.getLogger("sqlqueue.worker")

#: Times in a row the database refuses a lone outcome for its values before a substitute is
#: written instead: a refusal that is a race (a unique key another transaction just let go)
#: passes on a second try, one that is the value never does.
REFUSALS_BEFORE_SUBSTITUTE = 3


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
        backoff: Backoff,
        on_written_alone: Callable[[list[Outcome]], None] = lambda batch: None,
    ) -> None:
        self._store = store
        self._db = db
        self._worker_id = worker_id
        self._on_written = on_written
        self._on_added = on_added
        #: Told of each batch written in its own transaction, outside the claim loop's rounds
        #: (whatever that made claimable, no round of the loop saw).
        self._on_written_alone = on_written_alone
        self._backoff = backoff
        self._pending: list[Outcome] = []
        self._in_flight = 0
        #: Whether :meth:`run` writes the outcomes: for good (shutdown) or until caught up.
        self._alone = False
        self._for_good = False
        #: The most outcomes a batch of :meth:`run` takes (halved after each failure).
        self._limit: int | None = None
        #: Refusals in a row of each job's lone outcome (see :meth:`_substitute`).
        self._refusals: dict[int, int] = {}
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
        """The next batch to write (at most one outcome per job) in the claim loop's round,
        or nothing while :meth:`run` writes them; report it with :meth:`settle`, or hand it
        back with :meth:`put_back` if the write failed."""
        if self._alone:
            return []
        return self._take(None)

    def _take(self, limit: int | None) -> list[Outcome]:
        batch, self._pending = _one_attempt_per_job(self._pending, limit)
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
        self._alone = self._for_good = True
        self._ready.set()

    def write_alone(self) -> None:
        """Writing the pending outcomes with a claim failed: :meth:`run` writes them in their
        own transactions until none is left, while the claim loop claims without them."""
        if self._pending:
            self._alone = True
            self._ready.set()

    async def run(self) -> None:
        """While writing alone, write batches (see the module docstring); until cancelled."""
        while True:
            await self._ready.wait()
            self._ready.clear()
            if not self._alone:
                continue
            batch = self._take(self._limit)
            if not batch:
                if not self._for_good and self._in_flight == 0:
                    self._alone = False  # caught up: the claim loop's rounds carry them again
                    self._limit = None
                continue
            try:
                landed = await self._db.call(partial(self._write, batch))
            except DatabaseError as error:
                stored = await self._substitute(batch, error)
                if stored is not None:
                    self._backoff.succeeded()
                    self.settle(*stored)
                    self._on_written_alone(stored[0])
                    self._ready.set()
                    continue
                delay = self._backoff.failed()
                log.warning(
                    "could not record %d job outcome(s): %s; retrying in %.3f s",
                    len(batch),
                    error,
                    delay,
                )
                self._limit = max(1, len(batch) // 2)
                self.put_back(batch)
                await asyncio.sleep(delay)
                self._ready.set()
                continue
            self._backoff.succeeded()
            self._limit = None if self._limit is None else self._limit * 2
            for outcome in batch:
                self._refusals.pop(outcome.job.id, None)
            self.settle(batch, landed)
            self._on_written_alone(batch)
            self._ready.set()  # the rest, or the hand-back to the claim loop

    async def _substitute(
        self, batch: list[Outcome], error: DatabaseError
    ) -> tuple[list[Outcome], set[int]] | None:
        """When the database has refused a lone outcome for its values
        :data:`REFUSALS_BEFORE_SUBSTITUTE` times in a row, write :func:`unstorable`'s
        failure in its place and return it with the landed ids; ``None`` otherwise (and when
        the substitute fails too: then the database, not the values, is at fault, and the
        original is retried like any failed write)."""
        if len(batch) != 1 or not isinstance(error, DatabaseRefused):
            return None
        (outcome,) = batch
        refusals = self._refusals.get(outcome.job.id, 0) + 1
        self._refusals[outcome.job.id] = refusals
        if refusals < REFUSALS_BEFORE_SUBSTITUTE:
            return None
        substitute = unstorable(outcome, str(error))
        try:
            landed = await self._db.call(partial(self._write, [substitute]))
        except DatabaseError as again:
            log.warning(
                "could not record job %d's substitute outcome either: %s", outcome.job.id, again
            )
            return None
        del self._refusals[outcome.job.id]
        log.error(
            "job %d's outcome could not be stored (%s); recorded as %s instead",
            outcome.job.id,
            error,
            "dead" if substitute.failure is not None and substitute.failure.dead else "failed",
        )
        return [substitute], landed

    def _write(self, batch: list[Outcome]) -> set[int]:
        succeeded, failures, results = outcome_fields(batch)
        return self._store.finish(
            worker_id=self._worker_id,
            succeeded=succeeded,
            failures=failures,
            results=results,
            batch_ids=succeeded_batches(batch),
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


def succeeded_batches(batch: list[Outcome]) -> list[int]:
    """The batches (and workflows) of the jobs that succeeded in ``batch``, as claimed: the
    store counts them in the completion's statement where it can (``Store.finish``)."""
    return sorted(
        {o.job.batch_id for o in batch if o.failure is None and o.job.batch_id is not None}
    )


def _one_attempt_per_job(
    pending: list[Outcome], limit: int | None = None
) -> tuple[list[Outcome], list[Outcome]]:
    """Split ``pending`` into a batch with at most one outcome per job (and at most ``limit``
    outcomes), and the rest.

    A worker can hold two attempts of one job: its stalled attempt, whose lease the reaper took,
    and its own re-claim of the job. A batch matches outcomes to rows (and results) by job id,
    so in one batch the stale attempt would pass for the landed one and its result overwrite it.
    """
    batch: list[Outcome] = []
    later: list[Outcome] = []
    seen: set[int] = set()
    for outcome in pending:
        full = limit is not None and len(batch) >= limit
        (later if full or outcome.job.id in seen else batch).append(outcome)
        seen.add(outcome.job.id)
    return batch, later
