"""What an answer means for the delivery: the status → action table, and ``Retry-After``.

=========================================  ==========================================
answer                                     action
=========================================  ==========================================
2xx                                        succeeded (the job's result notes the answer)
408, 429, 5xx, timeout, connection error   retried with the backoff, or after ``Retry-After``
410 Gone                                   dead, and the endpoint disabled saying why
3xx                                        dead: redirects are not followed
other 4xx (and any other status)           dead, unless the endpoint lists it in
                                           ``retry_statuses``
=========================================  ==========================================
"""

from __future__ import annotations

import email.utils
import math
from datetime import UTC, datetime

from sqlqueue._digits import ascii_number
from sqlqueue.webhooks._endpoints import Endpoint
from sqlqueue.webhooks._errors import DeliveryFailed, DeliveryRejected
from sqlqueue.webhooks._http import Answer

__all__ = ["ALWAYS_RETRIED", "judge", "retry_after_seconds"]

#: 4xx answers that say "not now" rather than "no": retried for every endpoint.
ALWAYS_RETRIED = frozenset({408, 429})


def retry_after_seconds(value: str | None, *, now: datetime, cap: float) -> float | None:
    """The delay a ``Retry-After`` value asks for (seconds, or an HTTP date), at most ``cap``;
    ``None`` when absent or unreadable (the backoff applies then)."""
    if value is None:
        return None
    text = value.strip()
    number = ascii_number(text)
    if number is not None:
        seconds = float(number)
    elif text[:1].isdigit():  # digits, but not ASCII ones or too many: not a date either
        return None
    else:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:  # an HTTP date is GMT; "-0000" parses naive
            when = when.replace(tzinfo=UTC)
        seconds = (when - now).total_seconds()
    if not math.isfinite(seconds):
        return None
    return min(max(0.0, seconds), cap)


def judge(answer: Answer, endpoint: Endpoint, *, now: datetime, retry_after_cap: float) -> None:
    """Return if the answer is a success; otherwise raise what the job should do about it:
    :class:`DeliveryFailed` (retry) or :class:`DeliveryRejected` (dead). A 410 is rejected
    here too; disabling its endpoint is the caller's part."""
    status = answer.status
    if status is not None and 200 <= status <= 299:
        return
    message = answer.describe()
    details = answer.details()
    if status is None or status >= 500 or status in ALWAYS_RETRIED:
        delay = retry_after_seconds(answer.retry_after, now=now, cap=retry_after_cap)
        if delay is not None:
            details["retry_in_seconds"] = delay
        raise DeliveryFailed(delay, reason=message, details=details)
    if 300 <= status <= 399:
        where = f" to {answer.location}" if answer.location else ""
        raise DeliveryRejected(
            f"{message}: a redirect{where}, not followed; update the endpoint's URL",
            details=details,
        )
    if status == 410:
        raise DeliveryRejected(
            f"{message}: the receiver is gone; endpoint {endpoint.name!r} disabled",
            details=details,
        )
    if status in endpoint.retry_statuses:
        raise DeliveryFailed(None, reason=message, details=details)
    raise DeliveryRejected(message, details=details)
