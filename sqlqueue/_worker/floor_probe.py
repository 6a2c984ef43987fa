"""The worker's floor probe: every ``FLOOR_RESET_SECONDS`` it looks before the worker's claim
floors for a job a claim without them would take (``sqlqueue/_store/floor_probe.py``), on a
database thread of its own, so a look that walks a long transaction's dead row
versions delays no claim. When it lowers a floor, the worker's pools claim at once.

Only on a dialect that ``supports_claim_floor`` (PostgreSQL). The read takes a pooled
connection: the database thread's when that is idle, else one more, which the pool keeps.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from sqlqueue._store.claim_floor import FLOOR_RESET_SECONDS
from sqlqueue._store.store import Store
from sqlqueue._worker.dbthread import DatabaseThread
from sqlqueue._worker.upkeep import every

__all__ = ["FloorProbe"]


class FloorProbe:
    """Runs :meth:`Store.probe_claim_floors` periodically on its own thread."""

    def __init__(self, store: Store, worker_id: str, on_lowered: Callable[[], None]) -> None:
        self._store = store
        self._started = False
        self._on_lowered = on_lowered
        self._db = DatabaseThread(worker_id)

    async def probe_once(self) -> None:
        """One look before every floor; wake the claims if a floor went down."""
        if await self._db.call(self._store.probe_claim_floors):
            self._on_lowered()

    def start(self) -> asyncio.Task[None]:
        """The periodic task (cancel it, then :meth:`close`)."""
        self._store.claim_floors.probe_started()
        self._started = True
        return asyncio.create_task(
            every(
                FLOOR_RESET_SECONDS, self.probe_once, "claim floor probe", answers=self._db.answers
            ),
            name="sqlqueue-floor-probe",
        )

    def close(self) -> None:
        """Finish a probe under way and stop the thread."""
        self._db.close()
        if self._started:
            self._store.claim_floors.probe_stopped()
            self._started = False
