"""A workflow as a list of workflows shows it (:meth:`Queue.workflows`): its counts by status and
the steps holding it up, read from the workflow's row and its jobs' index, never from its step
rows one by one, so a page of big workflows costs what a page of small ones does."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlqueue._job import TERMINAL, JobStatus

__all__ = ["WorkflowSummary"]


@dataclass(frozen=True, kw_only=True)
class WorkflowSummary:
    """Where a workflow is, without its steps: ``total`` steps, how many are in each status
    (``counts`` has every :class:`JobStatus`; a finished workflow's counts are final),
    ``on_dead`` (its policy), ``finished_at`` once every step ended, and ``blocked_by``: the
    dead or cancelled steps holding steps ``waiting`` under ``on_dead="wait"``, by name (sorted).
    :meth:`Queue.get_workflow` has every step."""

    id: int
    on_dead: str
    total: int
    counts: Mapping[JobStatus, int]
    created_at: datetime
    finished_at: datetime | None
    blocked_by: tuple[str, ...]

    @property
    def done(self) -> int:
        """Steps that reached a terminal status (succeeded, dead or cancelled)."""
        return sum(self.counts[status] for status in TERMINAL)

    @property
    def finished(self) -> bool:
        """Whether every step has ended."""
        return self.finished_at is not None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready values: counts by status name, times in ISO 8601."""
        return {
            "id": self.id,
            "on_dead": self.on_dead,
            "total": self.total,
            "done": self.done,
            "counts": {status.value: count for status, count in self.counts.items()},
            "created_at": self.created_at.isoformat(),
            "finished_at": None if self.finished_at is None else self.finished_at.isoformat(),
            "finished": self.finished,
            "blocked_by": list(self.blocked_by),
        }
