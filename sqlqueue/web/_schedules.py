"""The Periodic page: each cron schedule declared on the queue, with its next slot and the job
of its last slot (the scheduler enqueues a slot as the job whose idempotency key names it, so
the page finds it by that key). The schedules live in code, not in the database: the page
shows those of the queue it was created with."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from sqlqueue._job import Job
from sqlqueue._policies.periodic import Periodic
from sqlqueue._queue import Queue
from sqlqueue.web._render import render
from sqlqueue.web._settings import settings_of

__all__ = ["ScheduleView", "periodic_page", "read_schedules"]


@dataclass(frozen=True, kw_only=True)
class ScheduleView:
    """One schedule as the page shows it: its next slot, its last slot (both in the schedule's
    time zone) and the job enqueued for the last slot (``None``: not enqueued, yet or at all)."""

    schedule: Periodic
    next_slot: datetime
    last_slot: datetime
    last_job: Job | None

    @property
    def next_slot_utc(self) -> datetime:
        """The next slot in UTC, the time every other date on the page is in."""
        return self.next_slot.astimezone(UTC)


def read_schedules(queue: Queue) -> tuple[datetime, list[ScheduleView]]:
    """The database clock's time and every schedule of ``queue`` as of then."""
    now = queue.database_now()
    views = []
    for schedule in queue.periodic_schedules:
        last = schedule.latest_slot(now)
        found = queue.jobs(idempotency_key=schedule.key(last), limit=1)
        views.append(
            ScheduleView(
                schedule=schedule,
                next_slot=schedule.next_slot(now),
                last_slot=last,
                last_job=found[0] if found else None,
            )
        )
    return now, views


async def periodic_page(request: Request) -> Response:
    """Every schedule: expression, time zone, next slot, last slot's job and its state."""
    settings = settings_of(request)
    settings.require(request, "view")
    now, views = await run_in_threadpool(read_schedules, settings.queue)
    return render(request, "periodic.html", {"schedules": views, "now": now})
