"""Which of a worker's queues an operator has paused, and the queues' limits of running jobs:
read from the database every poll interval (and at once on a PostgreSQL wake-up), so a pause or
a new limit reaches every worker on every host."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import NamedTuple

from sqlqueue._errors import DatabaseError
from sqlqueue._store.admin import Admin

__all__ = ["Change", "Pauses"]

log = logging.getLogger("sqlqueue.worker")


class Change(NamedTuple):
    """The paused queues before a read and after it."""

    before: frozenset[str]
    now: frozenset[str]


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

    def read(self) -> Change:
        """Read the queues paused now and apply them at once (a database call: run it on the
        worker's database thread); the queues' limits read with them go to ``on_limits``.

        Applied here, not in :meth:`update`: the worker's database calls run one at a time, so
        every claim round after this read leaves out the queues it found paused, and every round
        before it has finished. A pause is logged (by :meth:`update`) only once no claim
        computed without it can still take a job — on SQLite such a round could wait for the
        write lock past an enqueue made after the log line, and lease the new jobs."""
        paused, limits = self._admin.queue_controls()
        self._on_limits(limits)
        before, self.paused = self.paused, frozenset(paused)
        return Change(before, self.paused)

    def update(self, change: Change) -> frozenset[str]:
        """Report a read's change; return the served queues it resumed (their pools may claim
        now)."""
        self._failing = False
        newly = (change.now - change.before) & self._served
        if newly:
            log.warning("queue(s) paused by an operator, no new claims: %s", sorted(newly))
        resumed = (change.before - change.now) & self._served
        if resumed:
            log.info("queue(s) resumed: %s", sorted(resumed))
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
