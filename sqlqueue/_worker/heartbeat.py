"""Heartbeats: a worker pushes forward the leases of the jobs it holds.

A lease the heartbeat no longer finds was taken by the reaper (the worker stalled past its
lease); the attempt may now run elsewhere and its outcome will be discarded by the fence.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlqueue._store.rows import ClaimedJob
from sqlqueue._store.store import Store

__all__ = ["Beat", "Heartbeat"]

log = logging.getLogger("sqlqueue.worker")


@dataclass(frozen=True, kw_only=True)
class Beat:
    """What one heartbeat learned: leases lost, and jobs someone asked to cancel."""

    lost: frozenset[int]
    cancel_requested: frozenset[int]


class Heartbeat:
    """Extends the leases of one worker's jobs, ``lease_seconds`` from the database's now."""

    def __init__(self, store: Store, *, worker_id: str, lease_seconds: float) -> None:
        self._store = store
        self._worker_id = worker_id
        self._lease_seconds = lease_seconds

    def run_once(self, jobs: Sequence[ClaimedJob], *, still_running: Callable[[int], bool]) -> Beat:
        """Extend the leases of ``jobs``; report (and log) the running jobs whose lease was
        lost, and those whose cancellation was requested."""
        if not jobs:
            return Beat(lost=frozenset(), cancel_requested=frozenset())
        held = self._store.extend_leases(
            worker_id=self._worker_id,
            fences=[job.fence for job in jobs],
            lease_seconds=self._lease_seconds,
        )
        lost = {job.id for job in jobs if job.id not in held and still_running(job.id)}
        for job in jobs:
            if job.id in lost:
                log.warning(
                    "lost the lease on running job %d (%s, attempt %d): it was reaped and may "
                    "run elsewhere; this attempt's outcome will be discarded",
                    job.id,
                    job.job_type,
                    job.attempt,
                )
        return Beat(
            lost=frozenset(lost),
            cancel_requested=frozenset(job_id for job_id, asked in held.items() if asked),
        )
