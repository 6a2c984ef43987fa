"""The queue the poison process test's worker serves: healthy jobs, and one task for each
poison of ``tests/apps/poisons.py``.

``python -m sqlqueue worker tests.apps.poison_app:queue`` with ``SQLQUEUE_DATABASE_URL`` set.
Every poison task has one attempt, so each ends ``dead`` and stays there.
"""

from __future__ import annotations

import os
import time

import sqlqueue
from tests.apps.poisons import POISONS

queue = sqlqueue.Queue(os.environ["SQLQUEUE_DATABASE_URL"])


@queue.task("healthy")
def healthy(n: int) -> int:
    """A job that takes a moment and succeeds."""
    time.sleep(0.01)
    return n


for _name, _handler in POISONS.items():
    queue.task(_name, max_attempts=1)(_handler)
