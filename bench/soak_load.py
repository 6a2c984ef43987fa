"""The soak's load beside its workers: the enqueuer that offers a steady rate to one database,
and, on a PostgreSQL server that runs without autovacuum, the VACUUM that stands in for it."""

from __future__ import annotations

import threading
import time

import sqlqueue
from bench.databases import postgres_dsn
from bench.names import SOAK_JOB, SOAK_MAX_ATTEMPTS

__all__ = ["Enqueuer", "Vacuumer", "failures_of"]

#: Seconds between the enqueuer's transactions.
TICK = 0.1


def failures_of(seq: int) -> int:
    """How many attempts job number ``seq`` fails: 4 in 100 fail once, 1 in 100 every time."""
    slot = seq % 100
    if slot < 4:
        return 1
    return SOAK_MAX_ATTEMPTS if slot == 4 else 0


class Enqueuer(threading.Thread):
    """Offers ``rate`` jobs/s to one database, one transaction every ``TICK`` s."""

    def __init__(self, url: str, rate: int, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self._queue = sqlqueue.Queue(url)
        self._per_tick = max(1, round(rate * TICK))
        self._stop_event = stop
        self.enqueued = 0
        self.errors: list[str] = []

    def run(self) -> None:
        next_at = time.monotonic()
        try:
            while not self._stop_event.is_set():
                requests = [
                    sqlqueue.JobRequest(
                        job_type=SOAK_JOB, payload={"fails": failures_of(seq)}, external=True
                    )
                    for seq in range(self.enqueued, self.enqueued + self._per_tick)
                ]
                try:
                    with self._queue.engine.begin() as conn:
                        self._queue.enqueue_many(conn, requests)
                    self.enqueued += self._per_tick
                except sqlqueue.DatabaseError as error:  # counted and reported, not fatal
                    self.errors.append(repr(error))
                next_at += TICK
                pause = next_at - time.monotonic()
                if pause > 0:
                    self._stop_event.wait(pause)
                else:
                    next_at = time.monotonic()  # behind: do not burst to catch up
        finally:
            self._queue.engine.dispose()


class Vacuumer(threading.Thread):
    """Stands in for autovacuum on a PostgreSQL server that runs without it (test servers
    often do): ``VACUUM (ANALYZE) sqlqueue_jobs`` every ``interval`` seconds, what autovacuum
    at its default naptime (60 s) and scale factor does to a table this busy (its dead
    versions pass 20 % of its live rows within seconds)."""

    def __init__(self, url: str, interval: float, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self._url = url
        self._interval = interval
        self._stop_event = stop
        self.vacuums = 0
        self.errors: list[str] = []

    @staticmethod
    def needed(url: str) -> bool:
        """Whether the server at ``url`` runs without autovacuum."""
        import psycopg

        with psycopg.connect(postgres_dsn(url), autocommit=True) as conn:
            row = conn.execute("SHOW autovacuum").fetchone()
        return row is None or row[0] != "on"

    def run(self) -> None:
        import psycopg

        with psycopg.connect(postgres_dsn(self._url), autocommit=True) as conn:
            while not self._stop_event.wait(self._interval):
                try:
                    conn.execute("VACUUM (ANALYZE) sqlqueue_jobs")
                    self.vacuums += 1
                except psycopg.Error as error:  # counted and reported, not fatal
                    self.errors.append(repr(error))
