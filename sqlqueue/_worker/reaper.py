"""The reaper: gives jobs whose worker stopped heartbeating back to the queue.

Every worker runs one; they can run at the same time because each recovery is a fenced update
(and PostgreSQL reapers skip rows another reaper holds).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from sqlqueue._store.store import Store

__all__ = ["ReapResult", "Reaper"]

log = logging.getLogger("sqlqueue.reaper")


@dataclass(frozen=True, kw_only=True)
class ReapResult:
    """Ids of the jobs one pass put back in the queue, and of those it moved to dead."""

    retried: tuple[int, ...]
    dead: tuple[int, ...]


class Reaper:
    """Recovers jobs with an expired lease, ``batch_size`` rows per pass."""

    def __init__(self, store: Store, *, batch_size: int = 100) -> None:
        self._store = store
        self._batch_size = batch_size

    def run_once(self, *, now: datetime | None = None) -> ReapResult:
        """One pass: recover what expired (by the database clock, or ``now`` in tests)."""
        retried, dead = self._store.reap_expired(limit=self._batch_size, now=now)
        if retried or dead:
            log.warning(
                "reaped jobs whose lease expired: %d back to the queue %s, %d dead %s",
                len(retried),
                retried,
                len(dead),
                dead,
            )
        return ReapResult(retried=tuple(retried), dead=tuple(dead))
