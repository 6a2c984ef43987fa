"""The queue that worker processes in the rate-limit and circuit-breaker tests serve.

``python -m sqlqueue worker tests.apps.gates_app:queue`` with ``SQLQUEUE_DATABASE_URL`` set.
"""

from __future__ import annotations

import os

import sqlqueue
from tests.apps.gates import register_gate_tasks

queue = sqlqueue.Queue(os.environ["SQLQUEUE_DATABASE_URL"])
register_gate_tasks(queue)
