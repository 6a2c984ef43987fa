"""The queue that worker processes in the process tests serve.

``python -m sqlqueue worker tests.apps.ledger_app:queue`` with ``SQLQUEUE_DATABASE_URL`` set;
``LEDGER_LEASE_SECONDS`` shortens the lease for the crash test.
"""

from __future__ import annotations

import os

import sqlqueue
from tests.apps.ledger import register_ledger_tasks

queue = sqlqueue.Queue(
    os.environ["SQLQUEUE_DATABASE_URL"],
    lease_seconds=float(os.environ.get("LEDGER_LEASE_SECONDS", "30")),
)
register_ledger_tasks(queue)
