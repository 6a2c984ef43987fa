"""The queue that worker processes in the process tests serve.

``python -m sqlqueue worker tests.apps.ledger_app:queue`` with ``SQLQUEUE_DATABASE_URL`` set;
``LEDGER_LEASE_SECONDS`` sets the lease (a short one for the crash tests, one far longer than
the test where nothing may be reaped); ``LEDGER_REAPER_INTERVAL`` how often the worker's
reaper runs (``Queue.worker(reaper_interval=…)``, which the command line does not offer).
"""

from __future__ import annotations

import os

import sqlqueue
from tests.apps.ledger import register_ledger_tasks
from tests.apps.reaping import reap_as_the_environment_says

reap_as_the_environment_says()

queue = sqlqueue.Queue(
    os.environ["SQLQUEUE_DATABASE_URL"],
    lease_seconds=float(os.environ.get("LEDGER_LEASE_SECONDS", "30")),
)
register_ledger_tasks(queue)
