"""Slots: how many jobs a worker may run at once, per group of queues.

``queues=["mail", "reports"], concurrency=4`` is one pool of 4 slots shared by both queues;
``queues={"mail": 4, "reports": 1}`` gives each queue its own pool, so a flood of reports can
never take the slots that a password-reset email needs.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from sqlqueue._errors import ConfigurationError

__all__ = ["Pool", "Slots"]


@dataclass(eq=False)
class Pool:
    """Slots shared by ``queues``: at most ``limit`` of their jobs run at once."""

    queues: tuple[str, ...]
    limit: int
    running: set[int] = field(default_factory=set)
    #: The last claim found its queues empty: do not claim again before this (event-loop)
    #: time, unless a wake-up says a job arrived.
    rest_until: float = 0.0

    @property
    def free(self) -> int:
        """Slots not taken."""
        return self.limit - len(self.running)


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

    def claimable(self, now: float) -> list[tuple[Pool, int]]:
        """``(pool, free slots)`` of each pool that may claim at loop time ``now``."""
        return [(pool, pool.free) for pool in self.with_free_slots() if pool.rest_until <= now]

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

    def give_back(self, job_id: int) -> None:
        """``job_id`` finished: its slot is free again."""
        pool = self._owner.pop(job_id, None)
        if pool is not None:
            pool.running.discard(job_id)
