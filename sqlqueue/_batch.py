"""Batches as the public API sees them: the handle :meth:`Queue.enqueue_batch` returns, and a
frozen snapshot of a batch's progress (:meth:`Queue.get_batch`, ``ctx.batch``).

A batch is a group of jobs with a callback: an ordinary job, enqueued exactly once, in the
transaction that moves the last child to a terminal status (succeeded, dead or cancelled).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlqueue._job import TERMINAL, JobStatus

__all__ = ["Batch", "BatchStatus"]


@dataclass(frozen=True, kw_only=True)
class Batch:
    """A batch just written: its id and its children's job ids, in the order requested."""

    id: int
    job_ids: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class BatchStatus:
    """Where a batch is: ``total`` children, how many are in each status (``counts`` has every
    :class:`JobStatus`), and ``finished_at`` once the last one ended (then ``callback_job_id``
    is the callback enqueued, if the batch has one).

    The terminal counts are what each child ended as; once the batch is finished they are final
    (a dead child requeued afterwards runs as an ordinary job and changes nothing here).
    """

    id: int
    total: int
    counts: Mapping[JobStatus, int]
    created_at: datetime
    finished_at: datetime | None
    callback_job_id: int | None

    @property
    def done(self) -> int:
        """Children that reached a terminal status (succeeded, dead or cancelled)."""
        return sum(self.counts[status] for status in TERMINAL)

    @property
    def pending(self) -> int:
        """Children not yet in a terminal status (queued, running or failed)."""
        return self.total - self.done

    @property
    def succeeded(self) -> int:
        """Children that succeeded."""
        return self.counts[JobStatus.SUCCEEDED]

    @property
    def dead(self) -> int:
        """Children that ended dead."""
        return self.counts[JobStatus.DEAD]

    @property
    def cancelled(self) -> int:
        """Children that were cancelled."""
        return self.counts[JobStatus.CANCELLED]

    @property
    def finished(self) -> bool:
        """Whether every child has ended (the callback, if any, is enqueued)."""
        return self.finished_at is not None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready values: counts by status name, times in ISO 8601."""
        return {
            "id": self.id,
            "total": self.total,
            "done": self.done,
            "pending": self.pending,
            "counts": {status.value: count for status, count in self.counts.items()},
            "created_at": self.created_at.isoformat(),
            "finished_at": None if self.finished_at is None else self.finished_at.isoformat(),
            "callback_job_id": self.callback_job_id,
        }
