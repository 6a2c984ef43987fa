"""Where a worker's claims start in the claim index: past the jobs it has already claimed.

While a transaction anywhere in the database holds the xmin horizon back, the queued version
of every job claimed since stays in the claim index, dead but not removable, at its head; a
claim that starts there visits each of them in the table before it reaches a due job (a
claim took 28 ms instead of 0.1 ms after three minutes at 200 jobs/s, see
docs/explanation/performance-long-transactions.md). So where the dialect allows
(``Dialect.supports_claim_floor``), a worker's claim starts at a floor: the (priority, due
time) of the first job of its last claim, less :data:`FLOOR_SLACK` for enqueues that commit
late. What sorts
before the floor (a more urgent job enqueued since, a group's next job freed late, a job due in
the past) is found by the claim without a floor that the worker runs at least every
:data:`FLOOR_RESET_SECONDS`; which job may be claimed never changes, only how soon.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

from sqlqueue._store.rows import ClaimedJob

__all__ = ["FLOOR_RESET_SECONDS", "FLOOR_SLACK", "ClaimFloor", "ClaimFloors"]

#: The longest a worker claims with a floor before it claims once without one.
FLOOR_RESET_SECONDS: Final = 5.0
#: How far before its last claim's first job a floor starts: a job enqueued by a transaction
#: that commits later than this after its insert waits for the next claim without a floor.
FLOOR_SLACK: Final = timedelta(seconds=10)


@dataclass(frozen=True, kw_only=True)
class ClaimFloor:
    """The claim order key a claim starts at: ``(priority, next_run_at) >= (priority, due)``."""

    priority: int
    due: datetime


@dataclass(kw_only=True)
class _State:
    floor: ClaimFloor | None = None
    unbounded_at: float = float("-inf")


class ClaimFloors:
    """The floor of each of a store's claims (one per worker, queues and job types)."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._states: dict[Hashable, _State] = {}
        self._lock = threading.Lock()

    def floor_for(self, key: Hashable) -> ClaimFloor | None:
        """The floor the next claim of ``key`` starts at, or None for a claim without one (the
        first, and one every :data:`FLOOR_RESET_SECONDS`)."""
        with self._lock:
            state = self._states.setdefault(key, _State())
            if state.floor is None or self._clock() - state.unbounded_at >= FLOOR_RESET_SECONDS:
                state.unbounded_at = self._clock()
                return None
            return state.floor

    def observe(self, key: Hashable, claimed: Sequence[ClaimedJob], *, bounded: bool) -> None:
        """Move the floor to the first of ``claimed`` less :data:`FLOOR_SLACK` (the claim found
        nothing before it that it could take). An empty claim keeps a floor, or clears it when
        it was a claim without one: nothing is claimable."""
        with self._lock:
            state = self._states.setdefault(key, _State())
            if claimed:
                first = min(claimed, key=lambda job: (job.priority, job.next_run_at))
                due = first.next_run_at - FLOOR_SLACK
                state.floor = ClaimFloor(priority=first.priority, due=due)
            elif not bounded:
                state.floor = None

    def reset(self) -> None:
        """Forget every floor: the next claims start at the head of the index."""
        with self._lock:
            self._states.clear()
