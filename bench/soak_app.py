"""The application the soak's workers serve: one task that fails as its payload asks, and a
short retention, so the job table reaches a steady size.

Workers load it with ``python -m sqlqueue worker bench.soak_app:queue``. The database comes from
``SQLQUEUE_DATABASE_URL``; the retention window and the prune interval (seconds) from
``SQLQUEUE_SOAK_RETENTION`` and ``SQLQUEUE_SOAK_PRUNE_INTERVAL``, which ``bench.soak`` sets. A
job ``{"fails": n}`` raises on its first ``n`` attempts: with ``n`` at least
``SOAK_MAX_ATTEMPTS`` it ends dead, with fewer it succeeds on a retry ``SOAK_RETRY_SECONDS``
later (``bench/names.py``).
"""

from __future__ import annotations

import os

import sqlqueue
from bench.names import (
    SOAK_JOB,
    SOAK_MAX_ATTEMPTS,
    SOAK_PRUNE_INTERVAL_VARIABLE,
    SOAK_RETENTION_VARIABLE,
    SOAK_RETRY_SECONDS,
)

__all__ = ["queue"]


class PlannedFailure(Exception):
    """What a soak job raises on the attempts its payload asks to fail."""


def _seconds(name: str) -> float:
    text = os.environ.get(name)
    if not text:
        raise SystemExit(f"bench.soak_app needs {name} (python -m bench.soak sets it)")
    return float(text)


_url = os.environ.get("SQLQUEUE_DATABASE_URL")
if not _url:
    raise SystemExit("bench.soak_app needs SQLQUEUE_DATABASE_URL (python -m bench.soak sets it)")
_window = _seconds(SOAK_RETENTION_VARIABLE)

queue = sqlqueue.Queue(
    _url,
    retention=sqlqueue.Retention(
        succeeded=_window,
        cancelled=_window,
        dead=_window,
        interval=_seconds(SOAK_PRUNE_INTERVAL_VARIABLE),
    ),
)


@queue.task(
    SOAK_JOB, max_attempts=SOAK_MAX_ATTEMPTS, backoff=[SOAK_RETRY_SECONDS] * SOAK_MAX_ATTEMPTS
)
def soak(fails: int, ctx: sqlqueue.JobContext) -> None:
    """Raise on the first ``fails`` attempts, then succeed (no work: the queue is measured)."""
    if ctx.attempt <= fails:
        raise PlannedFailure(f"planned failure {ctx.attempt} of {fails}")
