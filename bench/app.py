"""The application the benchmark's sqlqueue workers serve: no-op tasks (sync and async) and a
stamping task.

Workers load it with ``python -m sqlqueue worker bench.app:queue``; the database comes from
``SQLQUEUE_DATABASE_URL``, which the benchmark sets for each fresh database. ``stamp`` jobs
append ``seq time.time()`` to the file named by ``SQLQUEUE_BENCH_RECORD`` as their handler
starts, which is how pickup latency is measured.
"""

from __future__ import annotations

import os
import threading
import time
from typing import TextIO

import sqlqueue
from bench.names import NOOP, NOOP_ASYNC, RECORD_VARIABLE, STAMP

__all__ = ["queue"]

_url = os.environ.get("SQLQUEUE_DATABASE_URL")
if not _url:
    raise SystemExit("bench.app needs SQLQUEUE_DATABASE_URL (the benchmark sets it)")

queue = sqlqueue.Queue(_url)
_record_lock = threading.Lock()
_record: TextIO | None = None


@queue.task(NOOP)
def noop(**_payload: object) -> None:
    """Do nothing: the benchmark measures the queue, not the work."""


@queue.task(NOOP_ASYNC)
async def noop_async(**_payload: object) -> None:
    """Do nothing on the event loop: the queue's cost without a thread hop per job."""


@queue.task(STAMP)
def stamp(seq: int) -> None:
    """Record when this handler started, on this machine's wall clock."""
    started = time.time()
    global _record
    with _record_lock:
        if _record is None:
            _record = open(os.environ[RECORD_VARIABLE], "a", encoding="utf-8")  # noqa: SIM115
        _record.write(f"{seq} {started!r}\n")
        _record.flush()
