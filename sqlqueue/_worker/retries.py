"""How a worker waits before it tries a failed database call again.

A statement that fails while the database answers others (a lock timeout, a serialization
failure, a dropped connection, a deadlock victim) is a passing fault: the call is tried again
after tens of milliseconds, doubling with each failure in a row up to a small cap, so one
failure never costs the queue seconds. Only when the database has answered none of the
worker's calls for a while (an outage: a restart, a failover) does the cap rise, step by
step, to the reconnect cap, so a fleet of workers does not hammer a server that is down.
Each duty (the claim round, the outcome writes, heartbeats, upkeep) keeps its own
:class:`Backoff`, reset when its call succeeds; :class:`Answers` is shared by all of them.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from sqlqueue._errors import DatabaseError

__all__ = [
    "FIRST_RETRY_SECONDS",
    "OUTAGE_AFTER_SECONDS",
    "OUTAGE_CAP_SECONDS",
    "QUICK_CAP_SECONDS",
    "Answers",
    "Backoff",
    "retry_quickly",
]

log = logging.getLogger("sqlqueue.worker")

T = TypeVar("T")

#: The wait before the first retry of a failed call.
FIRST_RETRY_SECONDS = 0.02
#: The longest wait while the database answers the worker's other calls.
QUICK_CAP_SECONDS = 1.5
#: No call answered for this long: the database is out, and the cap starts to rise.
OUTAGE_AFTER_SECONDS = 10.0
#: The longest wait during an outage (the cap doubles from the quick one up to this).
OUTAGE_CAP_SECONDS = 30.0


class Answers:
    """When the database last answered one of this worker's calls (any call)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._last = clock()

    def answered(self) -> None:
        """A call just succeeded."""
        self._last = self._clock()

    def silent_for(self) -> float:
        """Seconds since the database last answered."""
        return self._clock() - self._last


class Backoff:
    """The waits of one duty's retries: see the module docstring."""

    def __init__(self, answers: Answers) -> None:
        self._answers = answers
        self.failures = 0

    def failed(self) -> float:
        """The duty's call failed again: seconds to wait before the next try."""
        self.failures += 1
        cap = QUICK_CAP_SECONDS
        silent = self._answers.silent_for()
        if silent > OUTAGE_AFTER_SECONDS:
            # One doubling of the cap per OUTAGE_AFTER_SECONDS of silence, up to the outage cap.
            steps = min(int(silent // OUTAGE_AFTER_SECONDS), 10)
            cap = min(OUTAGE_CAP_SECONDS, QUICK_CAP_SECONDS * 2.0**steps)
        delay = min(cap, FIRST_RETRY_SECONDS * 2.0 ** min(self.failures - 1, 20))
        return delay * random.uniform(0.8, 1.2)

    def succeeded(self) -> None:
        """The duty's call succeeded: its next failure starts from the first wait again."""
        self.failures = 0


async def retry_quickly(
    call: Callable[[], Awaitable[T]],
    backoff: Backoff,
    *,
    tries: int,
    what: str,
    sleep: Callable[[float], Awaitable[object]],
) -> T:
    """Await ``call()`` up to ``tries`` times while it raises :class:`DatabaseError`, waiting
    ``backoff``'s delays in between; the last failure propagates. For a write whose caller
    has something sensible to do if it never lands (defer the job, leave a lease to expire)."""
    for attempt in range(1, tries + 1):
        try:
            result = await call()
        except DatabaseError as error:
            if attempt == tries:
                raise
            delay = backoff.failed()
            log.warning("%s failed: %s; retrying in %.3f s", what, error, delay)
            await sleep(delay)
            continue
        backoff.succeeded()
        return result
    raise AssertionError("unreachable")  # pragma: no cover - tries >= 1
