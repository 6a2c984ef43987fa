"""Heartbeats: a worker pushes forward the leases of the jobs it holds, and writes its row in
the live workers' table in the same transaction (see registry.py).

A lease the heartbeat no longer finds was taken by the reaper (the worker stalled past its
lease); the attempt may now run elsewhere and its outcome will be discarded by the fence.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlqueue._store.rows import ClaimedJob
from sqlqueue._store.store import Store
from sqlqueue._worker.registry import Registration

__all__ = ["Beat", "Heartbeat"]

log = logging.getLogger("sqlqueue.worker")


@dataclass(frozen=True, kw_only=True)
class Beat:
    """What one heartbeat learned: leases lost, and jobs someone asked to cancel."""

    lost: frozenset[int]
    cancel_requested: frozenset[int]


class Heartbeat:
    """Extends the leases of one worker's jobs, ``lease_seconds`` from the database's now, and
    keeps the worker's ``registration`` row current."""

    def __init__(self, store: Store, *, registration: Registration, lease_seconds: float) -> None:
        self._store = store
        self._registration = registration
        self._worker_id = registration.worker_id
        self._lease_seconds = lease_seconds

    def run_once(
        self,
        jobs: Sequence[ClaimedJob],
        *,
        still_running: Callable[[int], bool],
        running: int,
        stopping: bool,
    ) -> Beat:
        """Write the worker's row (``running`` jobs, ``stopping`` or not) and extend the
        leases of ``jobs``, in one transaction; report (and log) the running jobs whose lease
        was lost, and those whose cancellation was requested."""
        held = self._store.beat(
            worker_id=self._worker_id,
            fences=[job.fence for job in jobs],
            lease_seconds=self._lease_seconds,
            facts=self._registration.row(running=running, stopping=stopping),
            expires_in=self._registration.expires_in,
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
