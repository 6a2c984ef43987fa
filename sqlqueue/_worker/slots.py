"""Slots: how many jobs a worker may run at once, per group of queues.

``queues=["mail", "reports"], concurrency=4`` is one pool of 4 slots shared by both queues;
``queues={"mail": 4, "reports": 1}`` gives each queue its own pool, so a flood of reports can
never take the slots that a password-reset email needs.

A pool whose jobs are quick also claims ahead: up to one more batch beyond its free slots, held
(leased, not yet started) until a slot frees, so the next job starts without waiting for a
claim's round trip. Only then: a job held behind a long one would wait for it while another
worker sat idle.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence, Set
from dataclasses import dataclass, field

from sqlqueue._errors import ConfigurationError
from sqlqueue._store.rows import ClaimedJob

__all__ = ["Pool", "Slots"]

#: A pool whose jobs take at most this long on average claims ahead (see ``Pool.ahead``):
#: about a few claim round trips, so a held job waits no longer than that for its slot.
QUICK_SECONDS = 0.005
#: How much the latest job's time moves a pool's average (an exponential moving average).
_WEIGHT = 0.2
#: A pool that started none of its held jobs for this long has every slot taken by slow jobs:
#: it gives its held jobs back to the queue (another worker may be idle) and stops claiming
#: ahead until quick jobs bring its average down again.
HOLD_SECONDS = 0.5


@dataclass(eq=False)
class Pool:
    """Slots shared by ``queues``: at most ``limit`` of their jobs run at once."""

    queues: tuple[str, ...]
    limit: int
    running: set[int] = field(default_factory=set)
    #: Jobs claimed ahead of a free slot, oldest first: leased to this worker, not started.
    held: deque[ClaimedJob] = field(default_factory=deque)
    #: The average time its jobs ran, in seconds (``None`` until one has finished).
    average_seconds: float | None = None
    #: When (event-loop time) it last began holding or started a held job.
    held_since: float = 0.0
    #: The last claim found its queues empty: do not claim again before this (event-loop)
    #: time, unless a wake-up says a job arrived.
    rest_until: float = 0.0

    @property
    def free(self) -> int:
        """Slots not taken."""
        return self.limit - len(self.running)

    @property
    def ahead(self) -> int:
        """How many jobs this pool may hold beyond its free slots: one more batch while its
        jobs are quick, else none."""
        quick = self.average_seconds is not None and self.average_seconds <= QUICK_SECONDS
        return self.limit if quick else 0

    def describe(self) -> str:
        """``mail with 4 slots``, or ``default and mail sharing 4 slots``."""
        slots = f"{self.limit} slot{'' if self.limit == 1 else 's'}"
        if len(self.queues) == 1:
            return f"{self.queues[0]} with {slots}"
        return f"{', '.join(self.queues[:-1])} and {self.queues[-1]} sharing {slots}"

    def ran(self, seconds: float) -> None:
        """One of its jobs ran for ``seconds``."""
        average = self.average_seconds
        self.average_seconds = (
            seconds if average is None else average + _WEIGHT * (seconds - average)
        )

    def hold(self, job: ClaimedJob, now: float) -> None:
        """Hold ``job`` (claimed ahead, leased) until a slot frees."""
        if not self.held:
            self.held_since = now
        self.held.append(job)

    def next_held(self, now: float) -> ClaimedJob:
        """The oldest held job, to start in a slot that just freed."""
        self.held_since = now
        return self.held.popleft()

    def wanted(self) -> int:
        """How many jobs to claim now: its free slots plus what it may hold ahead, once its held
        jobs are down to half (a claim for a job or two would cost a round trip per job)."""
        if len(self.held) > self.ahead // 2:
            return 0
        return self.free + self.ahead - len(self.held)


class Slots:
    """A worker's pools, and which pool each running job holds a slot of."""

    def __init__(self, pools: Sequence[Pool]) -> None:
        self.pools = list(pools)
        self._owner: dict[int, Pool] = {}

    @classmethod
    def build(cls, queues: Sequence[str] | Mapping[str, int], concurrency: int) -> Slots:
        """One shared pool for a list of queues, or one pool per queue for a mapping."""
        if isinstance(queues, Mapping):
            for name, limit in queues.items():
                if not isinstance(limit, int) or limit < 1:
                    raise ConfigurationError(
                        f"queues: the concurrency of {name!r} must be an integer >= 1, "
                        f"got {limit!r}"
                    )
            return cls([Pool(queues=(name,), limit=limit) for name, limit in queues.items()])
        return cls([Pool(queues=tuple(queues), limit=concurrency)])

    @property
    def total(self) -> int:
        """All slots of all pools."""
        return sum(pool.limit for pool in self.pools)

    def describe(self) -> str:
        """The pools as a worker's start line names them: ``default and mail sharing 4
        slots``, or ``mail with 4 slots, reports with 1 slot (5 slots in all)``."""
        pools = ", ".join(pool.describe() for pool in self.pools)
        return pools if len(self.pools) == 1 else f"{pools} ({self.total} slots in all)"

    @property
    def queues(self) -> list[str]:
        """Every queue served."""
        return [name for pool in self.pools for name in pool.queues]

    @property
    def free(self) -> int:
        """Free slots of all pools."""
        return sum(pool.free for pool in self.pools)

    def with_free_slots(self) -> Iterator[Pool]:
        """The pools that could take another job now."""
        return (pool for pool in self.pools if pool.free > 0)

    # -- when to claim: a pool whose last claim came back short rests until its poll is due --

    @property
    def ahead(self) -> int:
        """Jobs all pools may hold beyond their free slots."""
        return sum(pool.ahead for pool in self.pools)

    @property
    def held(self) -> int:
        """Jobs held (claimed ahead, not started) by all pools."""
        return sum(len(pool.held) for pool in self.pools)

    def claimable(self, now: float) -> list[tuple[Pool, int]]:
        """``(pool, jobs wanted)`` of each pool that may claim at loop time ``now``."""
        return [
            (pool, wanted)
            for pool in self.pools
            if pool.rest_until <= now and (wanted := pool.wanted()) > 0
        ]

    def next_claim_in(self, now: float, longest: float) -> float:
        """Seconds until a resting pool with free slots may claim again (at most ``longest``)."""
        waits = [pool.rest_until - now for pool in self.with_free_slots()]
        return max(0.0, min(waits, default=longest))

    def wake(self, queues: Iterable[str] | None = None) -> None:
        """Jobs may be due in ``queues`` (all when ``None``): their pools stop resting."""
        names = None if queues is None else set(queues)
        for pool in self.pools:
            if names is None or not names.isdisjoint(pool.queues):
                pool.rest_until = 0.0

    def take(self, pool: Pool, job_id: int) -> None:
        """``job_id`` now runs in a slot of ``pool``."""
        pool.running.add(job_id)
        self._owner[job_id] = pool

    def give_back(self, job_id: int) -> Pool | None:
        """``job_id`` finished: its slot is free again (in the pool returned)."""
        pool = self._owner.pop(job_id, None)
        if pool is not None:
            pool.running.discard(job_id)
        return pool

    def held_ids(self) -> frozenset[int]:
        """The ids of every held job."""
        return frozenset(job.id for pool in self.pools for job in pool.held)

    def drop_held(self, job_ids: Set[int]) -> list[int]:
        """Stop holding the jobs of ``job_ids`` that are held (their leases were lost); return
        which were."""
        dropped: list[int] = []
        for pool in self.pools:
            keep = [job for job in pool.held if job.id not in job_ids]
            dropped.extend(job.id for job in pool.held if job.id in job_ids)
            pool.held = deque(keep)
        return dropped

    def take_stuck(self, now: float) -> list[ClaimedJob]:
        """The held jobs of pools that started none of them for ``HOLD_SECONDS``, no longer held
        (to give back to the queue); such a pool claims no more ahead until its jobs are quick
        again."""
        jobs: list[ClaimedJob] = []
        for pool in self.pools:
            if pool.held and now - pool.held_since > HOLD_SECONDS:
                jobs.extend(pool.held)
                pool.held.clear()
                pool.average_seconds = max(pool.average_seconds or 0.0, HOLD_SECONDS)
        return jobs

    def take_held(self) -> list[ClaimedJob]:
        """Every held job, no longer held (to give back at shutdown)."""
        jobs = [job for pool in self.pools for job in pool.held]
        for pool in self.pools:
            pool.held.clear()
        return jobs
