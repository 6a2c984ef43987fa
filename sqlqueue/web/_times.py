"""A new run time as an operator types it on a job's page: an ISO 8601 time (UTC when it names no
zone) or a duration from now (``+30m``, ``in 2h``). A time in the past, or one a database cannot
store, is refused with a :class:`~sqlqueue.ConfigurationError` that says why."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlqueue._errors import ConfigurationError
from sqlqueue._limits import EARLIEST, LATEST
from sqlqueue._moments import parse_duration

__all__ = ["parse_run_at"]

#: How far in the past a typed time may be and still count as "now": the page's clock and the
#: operator's typing lag the database clock a little.
_SLACK = timedelta(seconds=60)


def parse_run_at(text: str, *, now: datetime) -> datetime:
    """``text`` as a run time (UTC), checked against ``now`` (the database clock)."""
    text = text.strip()
    lowered = text.lower()
    if lowered.startswith(("+", "in ")):
        ahead = lowered.removeprefix("+").removeprefix("in ").strip()
        seconds = parse_duration(ahead, option="run at")
        return (now + timedelta(seconds=seconds)).astimezone(UTC)
    try:
        moment = datetime.fromisoformat(text)
    except (ValueError, OverflowError):
        raise ConfigurationError(
            f"run at: expected an ISO 8601 time (2026-12-01T18:00:00Z) or a duration from now "
            f"(+30m, in 2h), got {text[:100]!r}"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    utc: datetime | None
    try:
        utc = moment.astimezone(UTC)
    except OverflowError:
        utc = None
    if utc is None or not EARLIEST <= utc <= LATEST:
        raise ConfigurationError(
            f"run at: {text[:100]!r} is outside the times a database stores "
            f"({EARLIEST.year} to {LATEST.year})"
        )
    if utc < now - _SLACK:
        raise ConfigurationError(
            f"run at: {utc:%Y-%m-%d %H:%M:%S} UTC is in the past (the database clock says "
            f"{now.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC); to run the job now, use Retry now"
        )
    return utc
