"""A queue with an every-second schedule, for the periodic process test."""

from __future__ import annotations

import os

import sqlqueue
from tests.apps import UNOPENED_DATABASE

queue = sqlqueue.Queue(os.environ.get("SQLQUEUE_DATABASE_URL", UNOPENED_DATABASE))


@queue.periodic("* * * * * *", "tick")
def tick() -> None:
    """Nothing to do: the test counts the enqueued slots."""
