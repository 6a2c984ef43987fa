"""The application the soak's workers serve: one task that fails as its payload asks, and a
short retention, so the job table reaches a steady size.

Workers load it with ``python -m sqlqueue worker bench.soak_app:queue``. The database comes from
``SQLQUEUE_DATABASE_URL``; the retention window and the prune interval (seconds) from
``SQLQUEUE_SOAK_RETENTION`` and ``SQLQUEUE_SOAK_PRUNE_INTERVAL``, which ``bench.soak`` sets. A
job ``{"fails": n}`` raises on its first ``n`` attempts: with ``n`` at least
``SOAK_MAX_ATTEMPTS`` it ends dead, with fewer it succeeds on a retry ``SOAK_RETRY_SECONDS``
later (``bench/names.py``). With ``SQLQUEUE_BENCH_RECORD`` set (``bench.soak`` gives each
worker a file of its own), each attempt appends ``job_id attempt time.time()`` to that file as
its handler starts: the soak's pickup latency ends there, not at the row's ``started_at`` (a job
claimed ahead of a free slot has its ``started_at`` written later, with its outcome or the next
claim round, and a claim's time comes before the handler gets the job).
"""

from __future__ import annotations

import os
import threading
import time

import sqlqueue
from bench.names import (
    RECORD_VARIABLE,
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

_record_path = os.environ.get(RECORD_VARIABLE)
#: Line-buffered: each start reaches the file at once, and nothing piles up in memory. Open
#: for the process's life (closed when it exits).
_record = None
if _record_path:
    _record = open(_record_path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115
_record_lock = threading.Lock()


@queue.task(
    SOAK_JOB, max_attempts=SOAK_MAX_ATTEMPTS, backoff=[SOAK_RETRY_SECONDS] * SOAK_MAX_ATTEMPTS
)
def soak(fails: int, ctx: sqlqueue.JobContext) -> None:
    """Note the start, raise on the first ``fails`` attempts, then succeed (no work: the queue
    is measured)."""
    if _record is not None:
        line = f"{ctx.job_id} {ctx.attempt} {time.time():.6f}\n"
        with _record_lock:  # handlers run on several threads
            _record.write(line)
    if ctx.attempt <= fails:
        raise PlannedFailure(f"planned failure {ctx.attempt} of {fails}")
