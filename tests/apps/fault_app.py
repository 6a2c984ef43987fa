"""The queue the fault tests' worker processes serve (``tests.apps.fault_worker`` runs it).

``FAULT_LEASE_SECONDS`` sets the lease, ``FAULT_TIMEOUT_SECONDS`` the hanging tasks' timeout;
``FAULT_APPLICATION_NAME`` (PostgreSQL) names this process's connections ``NAME-PID`` so a
test can terminate exactly the worker's backends and tell whose they were.
"""

from __future__ import annotations

import os

import sqlalchemy as sa

import sqlqueue
from tests.apps import UNOPENED_DATABASE
from tests.apps.fault_tasks import register_fault_tasks


def _queue_url() -> str:
    url = os.environ.get("SQLQUEUE_DATABASE_URL", UNOPENED_DATABASE)
    name = os.environ.get("FAULT_APPLICATION_NAME")
    if not name:
        return url
    named = sa.make_url(url).update_query_dict({"application_name": f"{name}-{os.getpid()}"})
    return named.render_as_string(hide_password=False)


queue = sqlqueue.Queue(
    _queue_url(), lease_seconds=float(os.environ.get("FAULT_LEASE_SECONDS", "30"))
)
register_fault_tasks(queue, timeout=float(os.environ.get("FAULT_TIMEOUT_SECONDS", "0.5")))
