"""Periodic jobs: cron schedules declared on the queue, enqueued by every worker's scheduler.

Each slot of a schedule becomes one job whose idempotency key names the task and the slot
(``periodic:nightly_report:2026-11-29T03:00:00+00:00``), so however many workers run the
scheduler, the database lets exactly one of them enqueue it. Time is the database's clock.

Missed slots (every worker was down): with ``missed="latest"`` (the default) the most recent
missed slot runs once when a scheduler next looks, and older ones are skipped; with
``missed="skip"`` a slot is only enqueued within ``grace_seconds`` of its time.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from sqlqueue._errors import ConfigurationError
from sqlqueue._payload import DEFAULT_MAX_PAYLOAD_BYTES, check_payload

if TYPE_CHECKING:
    from sqlqueue._queue import Queue

__all__ = ["MissedSlots", "Periodic", "Scheduler"]

log = logging.getLogger("sqlqueue.scheduler")

#: What to do with slots that passed while no scheduler ran.
MissedSlots = Literal["latest", "skip"]


@dataclass(frozen=True, kw_only=True)
class Periodic:
    """One schedule: enqueue ``task`` with ``payload`` at every slot of ``cron``."""

    cron: str
    task: str
    payload: Mapping[str, Any] = field(default_factory=dict)
    timezone: str = "UTC"
    missed: MissedSlots = "latest"
    grace_seconds: float = 60.0

    def __post_init__(self) -> None:
        if not croniter.is_valid(self.cron):
            raise ConfigurationError(
                f"cron: {self.cron!r} is not a valid cron expression (five fields, or six with "
                "seconds last)"
            )
        try:
            ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise ConfigurationError(f"timezone: unknown time zone {self.timezone!r}") from None
        if self.missed not in ("latest", "skip"):
            raise ConfigurationError(f"missed must be 'latest' or 'skip', got {self.missed!r}")
        if self.grace_seconds <= 0:
            raise ConfigurationError(f"grace_seconds must be > 0, got {self.grace_seconds!r}")
        check_payload(self.payload, max_bytes=DEFAULT_MAX_PAYLOAD_BYTES)

    def latest_slot(self, now: datetime) -> datetime:
        """The last slot at or before ``now``."""
        local = now.astimezone(ZoneInfo(self.timezone)) + timedelta(microseconds=1)
        slot: datetime = croniter(self.cron, local).get_prev(datetime)
        return slot

    def key(self, slot: datetime) -> str:
        """The idempotency key of ``slot``'s job: one job per task and slot, ever."""
        return f"periodic:{self.task}:{slot.isoformat()}"


class Scheduler:
    """Enqueues the due slot of each schedule; safe to run in every worker at once."""

    def __init__(self, queue: Queue, schedules: Sequence[Periodic]) -> None:
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
