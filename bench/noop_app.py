"""The application the drain benchmark's sqlqueue workers serve: one task that does nothing.

Workers load it with ``python -m sqlqueue worker bench.noop_app:queue``; the database comes from
``SQLQUEUE_DATABASE_URL`` (``bench/drain.py`` sets it for each fresh database).
"""

from __future__ import annotations

import os

import sqlqueue

#: The job type ``bench/drain.py`` enqueues.
NOOP = "noop"

_url = os.environ.get("SQLQUEUE_DATABASE_URL")
if not _url:
    raise SystemExit("bench.noop_app needs SQLQUEUE_DATABASE_URL (bench/drain.py sets it)")

queue = sqlqueue.Queue(_url)


@queue.task(NOOP)
def noop() -> None:
    """Do nothing: the benchmark measures the queue, not the work."""
