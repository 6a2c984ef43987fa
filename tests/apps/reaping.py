"""``LEDGER_REAPER_INTERVAL``: how often the reaper of a test app's workers runs
(``Queue.worker(reaper_interval=…)``, which the command line does not offer), so a test can
give its survivors a lease far longer than the test and still have them reap a killed
worker's short leases at once."""

from __future__ import annotations

import functools
import os
from typing import Any

import sqlqueue

__all__ = ["reap_as_the_environment_says"]


def reap_as_the_environment_says() -> None:
    """With ``LEDGER_REAPER_INTERVAL`` set, every worker this process makes runs its reaper
    that often (seconds)."""
    if os.environ.get("LEDGER_REAPER_INTERVAL"):
        _reap_every(float(os.environ["LEDGER_REAPER_INTERVAL"]))


def _reap_every(seconds: float) -> None:
    original = sqlqueue.Queue.worker

    @functools.wraps(original)
    def worker(self: sqlqueue.Queue, **options: Any) -> sqlqueue.Worker:
        options.setdefault("reaper_interval", seconds)
        return original(self, **options)

    sqlqueue.Queue.worker = worker  # type: ignore[method-assign]
    print(f"test app: reaper every {seconds:g} s", flush=True)
