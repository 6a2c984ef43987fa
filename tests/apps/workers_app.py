"""The queue that worker processes in the workers' table tests serve.

``python -m sqlqueue worker tests.apps.workers_app:queue`` with ``SQLQUEUE_DATABASE_URL`` set;
``LEDGER_LEASE_SECONDS`` shortens the lease (and so the heartbeat interval, a third of it).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import sqlqueue

queue = sqlqueue.Queue(
    os.environ["SQLQUEUE_DATABASE_URL"],
    lease_seconds=float(os.environ.get("LEDGER_LEASE_SECONDS", "30")),
)


@queue.task("quick", queue="mail")
def quick(n: int) -> None:
    """A job of the ``mail`` queue that returns at once."""


@queue.task("hold", queue="reports")
def hold(flag: str) -> None:
    """Runs until the file ``flag`` exists (the test creates it), for at most a minute."""
    deadline = time.monotonic() + 60
    while not Path(flag).exists() and time.monotonic() < deadline:
        time.sleep(0.02)
