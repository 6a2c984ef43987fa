"""What an operator did to a job that the job's own columns do not say: who cancelled it, made
it due now or gave it a new run time, when and why (:meth:`sqlqueue.Queue.job_actions`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

__all__ = ["JobAction", "JobActionName"]

#: The actions recorded in ``sqlqueue_job_actions``.
JobActionName = Literal["cancel", "run_now", "reschedule"]


@dataclass(frozen=True, kw_only=True)
class JobAction:
    """One recorded action on job ``job_id``: ``action`` (``"cancel"``, ``"run_now"``,
    ``"reschedule"``), ``by`` whom, the ``reason`` they gave, ``at`` (database clock), and what
    it set (``detail``: ``{"run_at": "…"}`` for a reschedule)."""

    job_id: int
    action: str
    by: str
    reason: str
    at: datetime
    detail: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready values, the time in ISO 8601."""
        return {
            "job_id": self.job_id,
            "action": self.action,
            "by": self.by,
            "reason": self.reason,
            "at": self.at.isoformat(),
            "detail": dict(self.detail),
        }
