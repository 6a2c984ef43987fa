"""The scheduler: every worker looks at the clock and enqueues the due slot of each periodic
schedule; the slot's idempotency key lets exactly one of them succeed (see
``sqlqueue._policies.periodic``)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from sqlqueue._policies.periodic import Periodic

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from sqlqueue._store.store import Store

__all__ = ["Enqueuing", "Scheduler"]

log = logging.getLogger("sqlqueue.scheduler")


class Enqueuing(Protocol):
    """What the scheduler needs of the queue it enqueues on (a :class:`~sqlqueue.Queue` is
    one): its database, whose clock says which slot is due, and its ``enqueue``."""

    @property
    def engine(self) -> Engine: ...

    @property
    def store(self) -> Store: ...

    def enqueue(
        self,
        conn: Engine,
        job_type: str,
        payload: Mapping[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        run_at: datetime | None = None,
    ) -> int: ...


class Scheduler:
    """Enqueues the due slot of each schedule; safe to run in every worker at once."""

    def __init__(self, queue: Enqueuing, schedules: Sequence[Periodic]) -> None:
        self._queue = queue
        self._schedules = list(schedules)
        self._done: dict[str, datetime] = {}

    def run_once(self, *, now: datetime | None = None) -> list[int]:
        """One look at the clock: enqueue each schedule's latest slot (once); return job ids."""
        if not self._schedules:
            return []
        current = now or self._queue.store.database_now()
        enqueued: list[int] = []
        for schedule in self._schedules:
            slot = schedule.latest_slot(current)
            if self._done.get(schedule.task) == slot:
                continue
            late = (current - slot).total_seconds()
            if schedule.missed == "skip" and late > schedule.grace_seconds:
                self._done[schedule.task] = slot
                continue
            job_id = self._queue.enqueue(
                self._queue.engine,
                schedule.task,
                schedule.payload,
                idempotency_key=schedule.key(slot),
                run_at=slot,
            )
            self._done[schedule.task] = slot
            enqueued.append(job_id)
            log.debug("periodic %s: slot %s is job %d", schedule.task, slot.isoformat(), job_id)
        return enqueued
