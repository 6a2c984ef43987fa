"""The queue that worker processes in the process tests serve.

``python -m sqlqueue worker tests.apps.ledger_app:queue`` with ``SQLQUEUE_DATABASE_URL`` set;
``LEDGER_LEASE_SECONDS`` sets the lease (a short one for the crash tests, one far longer than
the test where nothing may be reaped); ``LEDGER_REAPER_INTERVAL`` how often the worker's
reaper runs (``Queue.worker(reaper_interval=…)``, which the command line does not offer).
"""

from __future__ import annotations

import functools
import os
from typing import Any

import sqlqueue
from tests.apps.ledger import register_ledger_tasks


def _reap_every(seconds: float) -> None:
    """Every worker this process makes runs its reaper every ``seconds``."""
    original = sqlqueue.Queue.worker

    @functools.wraps(original)
    def worker(self: sqlqueue.Queue, **options: Any) -> sqlqueue.Worker:
        options.setdefault("reaper_interval", seconds)
        return original(self, **options)

    sqlqueue.Queue.worker = worker  # type: ignore[method-assign]
    print(f"ledger app: reaper every {seconds:g} s", flush=True)


if os.environ.get("LEDGER_REAPER_INTERVAL"):
    _reap_every(float(os.environ["LEDGER_REAPER_INTERVAL"]))

queue = sqlqueue.Queue(
    os.environ["SQLQUEUE_DATABASE_URL"],
    lease_seconds=float(os.environ.get("LEDGER_LEASE_SECONDS", "30")),
)
register_ledger_tasks(queue)
