"""Which of a worker's queues an operator has paused, and the queues' limits of running jobs:
read from the database every poll interval (and at once on a PostgreSQL wake-up), so a pause or
a new limit reaches every worker on every host."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping

from sqlqueue._errors import DatabaseError
from sqlqueue._store.admin import Admin

__all__ = ["Pauses"]

log = logging.getLogger("sqlqueue.worker")


class Pauses:
    """The paused queues among those a worker serves, and the queues it may claim from."""

    def __init__(
        self,
        admin: Admin,
        served: Iterable[str],
        on_limits: Callable[[Mapping[str, int]], None] = lambda _: None,
    ) -> None:
        self._admin = admin
        self._on_limits = on_limits
        self._served = frozenset(served)
        self.paused: frozenset[str] = frozenset()
        self._failing = False

    def read(self) -> list[str]:
        """The queues paused now (a database call: run it on the worker's database thread);
        the queues' limits read with them go to ``on_limits``."""
        paused, limits = self._admin.queue_controls()
        self._on_limits(limits)
        return paused

    def update(self, paused: Iterable[str]) -> frozenset[str]:
        """Take a fresh read; return the served queues it resumed (their pools may claim now)."""
        now = frozenset(paused)
        self._failing = False
        newly = (now - self.paused) & self._served
        if newly:
            log.warning("queue(s) paused by an operator, no new claims: %s", sorted(newly))
        resumed = (self.paused - now) & self._served
        if resumed:
            log.info("queue(s) resumed: %s", sorted(resumed))
        self.paused = now
        return resumed

    def failed(self, error: DatabaseError) -> None:
        """A read failed: keep the last known pauses, and say so once per outage."""
        if not self._failing:
            log.warning("cannot read the paused queues: %s", error)
            self._failing = True

    def active(self, queues: tuple[str, ...]) -> tuple[str, ...]:
        """``queues`` less the paused ones."""
        if not self.paused:
            return queues
        return tuple(name for name in queues if name not in self.paused)
