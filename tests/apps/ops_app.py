"""The queue that worker processes in the operations tests serve: no-op jobs on two queues.

``python -m sqlqueue worker tests.apps.ops_app:queue`` with ``SQLQUEUE_DATABASE_URL`` set;
``OPS_RETENTION_SUCCEEDED`` (seconds) turns retention on, ``OPS_RETENTION_BATCH`` sets its batch.
"""

from __future__ import annotations

import os

import sqlqueue

_kept = os.environ.get("OPS_RETENTION_SUCCEEDED")
queue = sqlqueue.Queue(
    os.environ["SQLQUEUE_DATABASE_URL"],
    retention=sqlqueue.Retention(
        succeeded=float(_kept),
        interval=0.1,
        batch_size=int(os.environ.get("OPS_RETENTION_BATCH", "100")),
    )
    if _kept
    else None,
)


@queue.task("mail_job", queue="mail")
def mail_job(n: int) -> None:
    """A job of the ``mail`` queue."""


@queue.task("report_job", queue="reports")
def report_job(n: int) -> None:
    """A job of the ``reports`` queue."""
