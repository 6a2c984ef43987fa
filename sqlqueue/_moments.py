"""The instants every supported database stores, and what makes a delay from now storable.

Below every other module (even ``_errors``): ``Retry`` and ``Snooze`` check their delay with
:func:`delay_problem` where a handler makes them, and ``_limits`` holds enqueue options to the
same range. It says what is wrong as text; each caller raises its own error type.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

__all__ = ["CLOCK_MARGIN_SECONDS", "EARLIEST", "LATEST", "SURELY_STORABLE_DELAY", "delay_problem"]

#: The instants every supported database stores: MariaDB/MySQL ``DATETIME`` runs from the year
#: 1000 to 9999 (PostgreSQL's ``timestamptz`` and SQLite's ISO text hold more).
EARLIEST = datetime(1000, 1, 1, tzinfo=UTC)
LATEST = datetime(9999, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC)

#: How far the database clock may run ahead of this machine's: a delay is checked against this
#: machine's clock (the database's is not read first), with this margin.
CLOCK_MARGIN_SECONDS = 86_400.0

#: A delay of at most a century: storable for any clock before the year 9899.
SURELY_STORABLE_DELAY = 100 * 365.25 * 86_400


def delay_problem(field: str, value: object, latest: datetime = LATEST) -> str | None:
    """What is wrong with ``value`` as a delay in seconds from now whose run time is stored
    (a number >= 0, finite, its time no later than ``latest``), naming ``field``; ``None``
    when nothing is."""
    if (type(value) is float or type(value) is int) and 0 <= value <= SURELY_STORABLE_DELAY:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"{field} must be a number of seconds, got {type(value).__name__} {value!r:.80}"
    seconds = float(value)
    if math.isnan(seconds) or seconds < 0:
        return f"{field} must be >= 0 seconds, got {value!r}"
    if not math.isfinite(seconds):
        return f"{field} must be a finite number of seconds, got {value!r}"
    room = (latest - datetime.now(UTC)).total_seconds() - CLOCK_MARGIN_SECONDS
    if seconds > room:
        return (
            f"{field}={value!r} seconds puts the job after {latest.isoformat()}, the latest "
            f"time every supported database stores (at most {room:.0f} seconds from now)"
        )
    return None
