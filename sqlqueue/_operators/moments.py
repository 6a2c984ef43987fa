"""Times as operators type them: a duration (``90s``, ``2h``, ``7d``), a moment (ISO 8601, or
a duration ago counted back from a given ``now``, the database clock's), or a run time (ISO
8601, or a duration from now). Shared by the ``sqlqueue`` command's options and the web page's
``since`` filter and reschedule form."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from sqlqueue._errors import ConfigurationError
from sqlqueue._moments import EARLIEST, LATEST  # not _limits': SQLAlchemy, for the CLI parser

__all__ = ["parse_duration", "parse_moment", "parse_run_time"]

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNIT_SECONDS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


#: The longest duration accepted (a century): past it, times overflow the databases' range.
_MAX_SECONDS = 100 * 365 * 86400.0


def parse_duration(text: str, *, option: str) -> float:
    """``90s``, ``30m``, ``12h``, ``7d``, ``2w`` or plain seconds, as seconds."""
    match = _DURATION.match(text)
    if match is None:
        raise ConfigurationError(
            f"{option}: expected a duration such as 90s, 30m, 12h or 7d, got {text!r}"
        )
    seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    if seconds > _MAX_SECONDS:
        raise ConfigurationError(f"{option}: {text!r} is longer than a century")
    return seconds


def parse_moment(text: str, *, option: str, now: datetime) -> datetime:
    """An ISO 8601 time (UTC when it names no zone) or a duration ago (``2h``) from ``now``."""
    if _DURATION.match(text):
        return now - timedelta(seconds=parse_duration(text, option=option))
    try:
        moment = datetime.fromisoformat(text)
    except (ValueError, OverflowError):
        raise ConfigurationError(
            f"{option}: expected an ISO 8601 time (2026-11-30T08:00:00Z) or a duration ago "
            f"(2h, 7d), got {text!r}"
        ) from None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment


#: How far in the past a typed time may be and still count as "now": the page's clock and the
#: operator's typing lag the database clock a little.
_SLACK = timedelta(seconds=60)


def parse_run_time(text: str, *, now: datetime, option: str = "run at") -> datetime:
    """A new run time as an operator types it: an ISO 8601 time (UTC when it names no zone) or
    a duration from now (``+30m``, ``in 2h``), in UTC; one in the past (by ``now``, the
    database clock) or that no database stores is refused, saying why."""
    text = text.strip()
    lowered = text.lower()
    if lowered.startswith(("+", "in ")):
        ahead = lowered.removeprefix("+").removeprefix("in ").strip()
        seconds = parse_duration(ahead, option=option)
        return (now + timedelta(seconds=seconds)).astimezone(UTC)
    try:
        moment = datetime.fromisoformat(text)
    except (ValueError, OverflowError):
        raise ConfigurationError(
            f"{option}: expected an ISO 8601 time (2026-12-01T18:00:00Z) or a duration from now "
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
            f"{option}: {text[:100]!r} is outside the times a database stores "
            f"({EARLIEST.year} to {LATEST.year})"
        )
    if utc < now - _SLACK:
        raise ConfigurationError(
            f"{option}: {utc:%Y-%m-%d %H:%M:%S} UTC is in the past (the database clock says "
            f"{now.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC); to run the job now, use Retry now"
        )
    return utc
