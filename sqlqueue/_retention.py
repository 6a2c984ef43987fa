"""Retention: how long finished jobs are kept, and the worker duty that prunes the rest.

Every worker runs the duty, but one at a time across all hosts holds it (a lease row in
``sqlqueue_duties``); each batch is its own short transaction and takes only rows nobody else
holds, so even two pruners at once never delete the same row or fail.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from sqlqueue._errors import ConfigurationError
from sqlqueue._store.admin import Admin
from sqlqueue._store.counts import CountsBusy

__all__ = ["PRUNABLE", "Retention", "RetentionDuty", "check_prunable"]

if TYPE_CHECKING:
    from sqlqueue._dbthread import DatabaseThread

log = logging.getLogger("sqlqueue.retention")

#: Statuses that may be pruned: finished jobs only, never queued, running or failed ones.
PRUNABLE = ("succeeded", "cancelled", "dead")

#: The name of the duty's lease row.
DUTY_NAME = "retention"


def check_prunable(statuses: tuple[str, ...]) -> None:
    """Refuse to prune anything but finished jobs, naming what was asked."""
    wrong = [status for status in statuses if status not in PRUNABLE]
    if wrong or not statuses:
        raise ConfigurationError(
            f"statuses: only finished jobs can be pruned ({', '.join(PRUNABLE)}), got "
            f"{list(statuses)!r}"
        )


@dataclass(frozen=True, kw_only=True)
class Retention:
    """How many seconds finished jobs are kept, per status (``None``: kept for ever).

    ``Queue(retention=Retention(succeeded=7 * 86400, cancelled=7 * 86400, dead=30 * 86400))``
    makes workers prune every ``interval`` seconds, ``batch_size`` rows per transaction.
    Pruning a job frees its idempotency key.
    """

    succeeded: float | None = None
    cancelled: float | None = None
    dead: float | None = None
    interval: float = 60.0
    batch_size: int = 1000

    def __post_init__(self) -> None:
        for name in PRUNABLE:
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ConfigurationError(f"Retention.{name} must be >= 0 seconds, got {value!r}")
        if self.interval <= 0:
            raise ConfigurationError(f"Retention.interval must be > 0, got {self.interval!r}")
        if self.batch_size < 1:
            raise ConfigurationError(f"Retention.batch_size must be >= 1, got {self.batch_size!r}")

    def ages(self) -> Iterator[tuple[str, float]]:
        """``(status, seconds kept)`` for each status that is pruned."""
        for name in PRUNABLE:
            value: float | None = getattr(self, name)
            if value is not None:
                yield name, float(value)


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

    def release(self) -> None:
        """Give the duty up (a worker that stops), so another worker takes it at its next pass
        rather than when this lease runs out."""
        self._admin.release_duty(name=DUTY_NAME, holder=self._holder)

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
