"""The retention duty: prune finished jobs older than the queue's :class:`~sqlqueue.Retention`,
the rows of workers gone without a word long enough, and the lock rows of unique keys that no
job carries any more.

Every worker runs the duty, but one at a time across all hosts holds it (a lease row in
``sqlqueue_duties``); each batch is its own short transaction and takes only rows nobody else
holds, so even two pruners at once never delete the same row or fail.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING

from sqlqueue._errors import DatabaseError, DatabaseUnavailable
from sqlqueue._policies.retention import Retention
from sqlqueue._store.admin import Admin
from sqlqueue._store.counts import CountsBusy
from sqlqueue._store.history import HistoryBusy

__all__ = ["DUTY_NAME", "RetentionDuty"]

if TYPE_CHECKING:
    from sqlqueue._worker.dbthread import DatabaseThread

log = logging.getLogger("sqlqueue.retention")

#: The name of the duty's lease row.
DUTY_NAME = "retention"

#: Batches of unique keys a pass looks at, at most: the walk resumes where the last pass
#: stopped, so a pass costs the same however many keys live jobs hold.
KEY_BATCHES_PER_PASS = 10

#: How far before where its last full pass reached the mover starts: a job whose completion
#: committed that much later than its ``finished_at`` still moves.
MOVE_SLACK = timedelta(seconds=60)


class RetentionDuty:
    """The worker's pruning duty: a batch at a time, while it holds the retention lease."""

    def __init__(
        self, admin: Admin, retention: Retention, *, holder: str, single_writer: bool = False
    ) -> None:
        self._admin = admin
        self._single_writer = single_writer
        self.retention = retention
        self._holder = holder
        self.deleted = 0
        self.keys_deleted = 0
        self.moved = 0
        self._keys_after = ""
        #: Where the mover's last full pass reached, less :data:`MOVE_SLACK`: it starts there
        #: (what finished before is moved or never will be), so unmovable rows (keyed, batch)
        #: are not read again every pass. ``None``: from the beginning.
        self._moved_since: datetime | None = None
        #: Whether this duty moves succeeded jobs into a partitioned history and drops its days:
        #: only where succeeded jobs have a retention, else no day would ever be dropped and
        #: the history would gain a table a day for ever.
        self._moves = (
            admin.dialect.supports_history_partitions
            and retention.history_after is not None
            and retention.succeeded is not None
        )

    def acquire(self) -> bool:
        """Hold the duty for two intervals more if no other worker does."""
        return self._admin.take_duty(
            name=DUTY_NAME, holder=self._holder, seconds=max(2 * self.retention.interval, 30.0)
        )

    async def run_pass(self, db: DatabaseThread, stopping: Callable[[], bool]) -> None:
        """Prune what is due, if this worker holds the duty: one batch per call on ``db`` (the
        worker's database thread), so the worker's own claims and outcomes go between batches;
        on a single-writer database (SQLite) each batch is followed by a gap as long as it took,
        so other processes' claims get the write lock too."""
        if not await db.call(self.acquire):
            return
        loop = asyncio.get_running_loop()
        renewed = loop.time()
        if self._moves and not stopping():
            await self._history_step(db, self.drop_days, "dropping the history's expired days")
        reach: datetime | None = None
        if self._moves and not stopping():
            assert self.retention.history_after is not None
            reach = await db.call(
                partial(self._admin.movable_until, after=self.retention.history_after)
            )
        while self._moves and not stopping():
            if loop.time() - renewed > self.retention.interval / 2:
                if not await db.call(self.acquire):
                    return
                renewed = loop.time()
            moved = await self._history_step(db, self.move, "moving jobs into the history")
            if moved is None:
                break
            if moved < self.retention.batch_size:  # all moved that could, up to ``reach``
                if reach is not None:
                    self._moved_since = reach - MOVE_SLACK
                break
        for status, age in self.retention.ages():
            while not stopping():
                if loop.time() - renewed > self.retention.interval / 2:
                    if not await db.call(self.acquire):  # lost to another worker: its turn
                        return
                    renewed = loop.time()
                started = loop.time()
                try:
                    deleted = await db.call(partial(self.prune, status, age))
                except CountsBusy:  # a fold or another pruner is at it: next pass
                    return
                if deleted < self.retention.batch_size:
                    break
                if self._single_writer:
                    await asyncio.sleep(min(loop.time() - started, 0.2))
        if self.retention.gone_workers is not None and not stopping():
            await db.call(partial(self.prune_workers, self.retention.gone_workers))
        for _ in range(KEY_BATCHES_PER_PASS):
            if stopping():
                return
            started = loop.time()
            if not await db.call(self.prune_keys):
                return
            if self._single_writer:
                await asyncio.sleep(min(loop.time() - started, 0.2))

    @staticmethod
    async def _history_step(db: DatabaseThread, step: Callable[[], int], what: str) -> int | None:
        """Run a move or a drop on ``db``; ``None`` when it did nothing this pass: busy (a fold,
        a prune or a long reader of the history holds what it needs), or failed, which is
        logged with what to do. Either way the pass goes on to the batched prunes, gone workers
        and keys, which need none of the history's rights."""
        try:
            return await db.call(step)
        except (CountsBusy, HistoryBusy) as busy:
            log.info("retention: %s: not this pass (%s)", what, busy)
        except DatabaseUnavailable:
            raise
        except DatabaseError as error:
            log.warning(
                "retention: %s failed, the rest of the pass goes on: %s. The workers' database "
                "role needs CREATE on sqlqueue's schema and must own sqlqueue_jobs_history (run "
                "the workers as the role that ran `sqlqueue migrate`, or grant these); or set "
                "Retention(history_after=None) to prune succeeded jobs in batches instead",
                what,
                error,
            )
        return None

    def release(self) -> None:
        """Give the duty up (a worker that stops), so another worker takes it at its next pass
        rather than when this lease runs out."""
        self._admin.release_duty(name=DUTY_NAME, holder=self._holder)

    def prune_workers(self, age: float) -> int:
        """Delete the rows of workers gone without a heartbeat for ``age`` seconds; return how
        many went (a small table: one statement)."""
        deleted = self._admin.prune_gone_workers(older_than=age)
        if deleted:
            log.info("retention: pruned %d gone worker row(s) older than %g s", deleted, age)
        return deleted

    def prune_keys(self) -> bool:
        """Look at one batch of unique keys, where the walk stopped last, and delete those no
        job carries; ``False`` when the walk reached the end (it starts again next pass)."""
        deleted, last = self._admin.prune_unique_keys(
            after=self._keys_after, limit=self.retention.batch_size
        )
        self.keys_deleted += deleted
        if deleted:
            log.info("retention: pruned %d unique key(s) no job carries", deleted)
        self._keys_after = last or ""
        return last is not None

    def move(self) -> int:
        """Move one batch of succeeded jobs into the history; return how many moved."""
        assert self.retention.history_after is not None
        moved = self._admin.move_to_history(
            after=self.retention.history_after,
            keep=self.retention.succeeded,
            limit=self.retention.batch_size,
            since=self._moved_since,
        )
        self.moved += moved
        if moved:
            log.info("retention: moved %d succeeded job(s) into the history", moved)
        return moved

    def drop_days(self) -> int:
        """Drop the history's days past the succeeded retention; return how many jobs went."""
        if self.retention.succeeded is None:
            return 0
        dropped = self._admin.drop_history_days(older_than=self.retention.succeeded)
        self.deleted += dropped
        if dropped:
            log.info("retention: dropped %d succeeded job(s) with their days of history", dropped)
        return dropped

    def prune(self, status: str, age: float) -> int:
        """Delete one batch of ``status`` jobs older than ``age`` seconds; return how many went
        (fewer than ``batch_size``: that status is done for this pass)."""
        deleted = self._admin.prune_batch(
            status=status, older_than=age, limit=self.retention.batch_size
        )
        self.deleted += deleted
        if deleted:
            log.info("retention: pruned %d %s job(s) older than %g s", deleted, status, age)
        return deleted
