"""Periodic jobs: cron schedules declared on the queue (``sqlqueue._worker.scheduler`` enqueues
their slots in every worker).

Each slot of a schedule becomes one job whose idempotency key names the task and the slot
(``periodic:nightly_report:2026-11-29T03:00:00+00:00``), so however many workers run the
scheduler, the database lets exactly one of them enqueue it. Time is the database's clock.

Missed slots (every worker was down): with ``missed="latest"`` (the default) the most recent
missed slot runs once when a scheduler next looks, and older ones are skipped; with
``missed="skip"`` a slot is only enqueued within ``grace_seconds`` of its time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from sqlqueue._errors import ConfigurationError
from sqlqueue._payload import DEFAULT_MAX_PAYLOAD_BYTES, check_payload

__all__ = ["MissedSlots", "Periodic"]

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

    def next_slot(self, now: datetime) -> datetime:
        """The first slot after ``now``."""
        local = now.astimezone(ZoneInfo(self.timezone))
        slot: datetime = croniter(self.cron, local).get_next(datetime)
        return slot

    def key(self, slot: datetime) -> str:
        """The idempotency key of ``slot``'s job: one job per task and slot, ever."""
        return f"periodic:{self.task}:{slot.isoformat()}"
