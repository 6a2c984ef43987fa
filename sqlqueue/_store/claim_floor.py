"""Where a worker's claims start in the claim index: past the jobs it has already claimed.

While a transaction anywhere in the database holds the xmin horizon back, the queued version
of every job claimed since stays in the claim index, dead but not removable, at its head; a
claim that starts there visits each of them in the table before it reaches a due job (a
claim took 28 ms instead of 0.1 ms after three minutes at 200 jobs/s, see
docs/explanation/performance-long-transactions.md). So where the dialect allows
(``Dialect.supports_claim_floor``), a worker's claim starts at a floor: the (priority, due
time) of the first job of its last claim, less :data:`FLOOR_SLACK` for enqueues that commit
late.

What sorts before the floor (a more urgent job enqueued since, a group's next job freed late,
a job due in the past) is found by a look from the head of the index. A worker looks off its
claim path: its floor probe (``floor_probe.py``, on a database thread of its own, every
:data:`FLOOR_RESET_SECONDS`) finds the first claimable job before each floor and lowers the
floor to it, so no claim walks the dead versions unless there is a job to fetch behind them.
A claim itself runs without its floor when no look has started for
:data:`FLOOR_RESET_SECONDS` (twice that while a probe runs: one that stalls or fails), so a
bound holds without a probe too. Which job may be claimed never changes, only
how soon: at most one probe period and two probes' durations later with a probe, and never
more than ``2 * FLOOR_RESET_SECONDS`` plus a claim.

A workflow step released by a worker's own completion needs no look: the completion knows the
step's queue, type, priority and due time, and lowers the floors of this store's claims to it
(:meth:`ClaimFloors.lower`), so the worker's next claim (in the same transaction, when it
claims there) takes it. Other workers learn of it by their probe, as of an urgent enqueue.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

from sqlqueue._store.rows import ClaimedJob

__all__ = [
    "FLOOR_RESET_SECONDS",
    "FLOOR_SLACK",
    "ClaimFloor",
    "ClaimFloors",
    "FloorKey",
    "Released",
]

#: How often a worker's probe looks before its floors, and the longest a claim runs with a
#: floor no look has covered before it runs once without it (twice this once a probe covers it).
FLOOR_RESET_SECONDS: Final = 5.0
#: How far before its last claim's first job a floor starts: a job enqueued by a transaction
#: that commits later than this after its insert waits for the next look before the floor.
FLOOR_SLACK: Final = timedelta(seconds=10)


@dataclass(frozen=True, kw_only=True)
class ClaimFloor:
    """The claim order key a claim starts at: ``(priority, next_run_at) >= (priority, due)``."""

    priority: int
    due: datetime


@dataclass(frozen=True, kw_only=True)
class FloorKey:
    """What a floor belongs to: one worker's claims from ``queues`` of ``job_types``."""

    worker_id: str
    queues: tuple[str, ...]
    job_types: tuple[str, ...] | None


@dataclass(frozen=True, kw_only=True)
class Released:
    """A job a transaction made claimable (a workflow step released): where it sorts in claim
    order, and who may claim it."""

    job_id: int
    queue: str
    job_type: str
    priority: int
    due: datetime


@dataclass(kw_only=True)
class _State:
    floor: ClaimFloor | None = None
    #: When the last look before the floor started (a claim without it, or a probe).
    looked_at: float = float("-inf")


class ClaimFloors:
    """The floor of each of a store's claims (one per worker, queues and job types)."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._states: dict[FloorKey, _State] = {}
        self._lock = threading.Lock()
        #: How many probes look before these floors (workers of this store running one).
        self._probes = 0

    def now(self) -> float:
        """This object's clock: when a probe starts, for :meth:`probed`."""
        return self._clock()

    def floor_for(self, key: FloorKey) -> ClaimFloor | None:
        """The floor the next claim of ``key`` starts at, or None for a claim without one (the
        first, and one whenever no look before the floor started for :data:`FLOOR_RESET_SECONDS`,
        twice that while a probe runs)."""
        with self._lock:
            state = self._states.setdefault(key, _State())
            bound = FLOOR_RESET_SECONDS * (2 if self._probes else 1)
            if state.floor is None or self._clock() - state.looked_at >= bound:
                state.looked_at = self._clock()
                return None
            return state.floor

    def observe(self, key: FloorKey, claimed: Sequence[ClaimedJob], *, bounded: bool) -> None:
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

    def floors(self) -> list[tuple[FloorKey, ClaimFloor]]:
        """Every key that has a floor now, with it: what a probe looks before."""
        with self._lock:
            return [(key, s.floor) for key, s in self._states.items() if s.floor is not None]

    def probed(self, key: FloorKey, started: float, found: ClaimFloor | None) -> bool:
        """A probe that started at ``started`` (:meth:`now`) looked before ``key``'s floor and
        ``found`` the first claimable job there, or nothing: lower the floor to it. Whether the
        floor went down (the worker then claims at once)."""
        with self._lock:
            state = self._states.get(key)
            if state is None:
                return False
            state.looked_at = max(state.looked_at, started)
            if found is None or state.floor is None:
                return False
            if (found.priority, found.due) >= (state.floor.priority, state.floor.due):
                return False
            state.floor = found
            return True

    def lower(self, released: Sequence[Released]) -> bool:
        """Lower each floor whose claims may take one of ``released`` to the first of those
        (in claim order), so the next claim starts before it; whether one went down."""
        if not released:
            return False
        lowered = False
        with self._lock:
            for key, state in self._states.items():
                mine = [
                    (job.priority, job.due)
                    for job in released
                    if job.queue in key.queues
                    and (key.job_types is None or job.job_type in key.job_types)
                ]
                if state.floor is None or not mine:
                    continue
                priority, due = min(mine)
                if (priority, due) < (state.floor.priority, state.floor.due):
                    state.floor = ClaimFloor(priority=priority, due=due)
                    lowered = True
        return lowered

    def probe_started(self) -> None:
        """A probe looks before these floors every :data:`FLOOR_RESET_SECONDS` from now on:
        claims look themselves only when no look started for twice that."""
        with self._lock:
            self._probes += 1

    def probe_stopped(self) -> None:
        """A probe of :meth:`probe_started` stopped."""
        with self._lock:
            self._probes -= 1

    def reset(self) -> None:
        """Forget every floor: the next claims start at the head of the index."""
        with self._lock:
            self._states.clear()
