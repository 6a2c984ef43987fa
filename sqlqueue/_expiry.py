"""Job expiry: when a job that has not started by then is cancelled instead of run late.

``expires_in`` counts seconds from the enqueuing process's clock; ``expires_at`` is an aware
datetime. Both are checked here, before any SQL, within what the column stores on every
backend. The claim skips a job past its expiry by the database clock (see
``sqlqueue/dialects/_claiming.py``) and the worker's upkeep cancels it (``sqlqueue/_store/
expiry.py``), so a stale job never runs.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlqueue._errors import EnqueueError
from sqlqueue._limits import check_delay, check_moment
from sqlqueue._schema import jobs

__all__ = ["EXPIRED", "expiry_of"]

#: The reason recorded on a job cancelled because it expired.
EXPIRED = "expired"


def expiry_of(expires_in: object, expires_at: object) -> datetime | None:
    """The moment a job expires (UTC), or ``None`` when it never does; raises
    :class:`~sqlqueue.EnqueueError` for a value that is not a positive number of seconds or an
    aware datetime the column stores, or for both given."""
    if expires_in is None and expires_at is None:
        return None
    if expires_in is not None and expires_at is not None:
        raise EnqueueError("give either expires_in or expires_at, not both")
    if expires_at is not None:
        return check_moment("expires_at", expires_at, jobs.c.expires_at, EnqueueError).astimezone(
            UTC
        )
    seconds = check_delay("expires_in", expires_in, jobs.c.expires_at, EnqueueError)
    if seconds <= 0:
        raise EnqueueError(f"expires_in must be > 0 seconds, got {expires_in!r}")
    return datetime.now(UTC) + timedelta(seconds=seconds)
