"""What the FastAPI and Flask test apps share: a users table, and the ``welcome`` task whose
handler records each run in ``fw_welcomes`` (a job run twice shows as two rows).

``python -m sqlqueue worker tests.frameworks.welcome:queue`` serves it in a worker process
(with ``SQLQUEUE_DATABASE_URL`` set); the apps register it on their own Queue.
"""

from __future__ import annotations

import os
import threading

import sqlalchemy as sa

import sqlqueue

metadata = sa.MetaData()
users = sa.Table(
    "fw_users",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("email", sa.String(200), nullable=False),
)
welcomes = sa.Table(
    "fw_welcomes",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("user_id", sa.Integer, nullable=False),
)

#: Set when a ``hold`` job starts (in the test process: the lifespan's worker).
started = threading.Event()
_never = threading.Event()


def register_tasks(queue: sqlqueue.Queue) -> sqlqueue.Task:
    """Register ``welcome`` (and ``hold``) on ``queue``; return ``welcome``."""

    @queue.task("welcome")
    def welcome(user_id: int) -> None:
        with queue.engine.begin() as conn:
            conn.execute(welcomes.insert().values(user_id=user_id))

    @queue.task("hold")
    def hold(ctx: sqlqueue.JobContext) -> str:
        """Runs until its worker shuts down: then it finishes, as a graceful stop allows."""
        started.set()
        while not ctx.cancelled:
            _never.wait(0.01)  # poll ctx.cancelled
        return "finished during shutdown"

    return welcome


def _queue_from_environment() -> sqlqueue.Queue | None:
    url = os.environ.get("SQLQUEUE_DATABASE_URL")
    if url is None:
        return None
    served = sqlqueue.Queue(url)
    register_tasks(served)
    return served


queue = _queue_from_environment()
