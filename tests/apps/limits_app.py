"""The queue that worker processes in the concurrency-limit process tests serve.

``python -m sqlqueue worker tests.apps.limits_app:queue`` with ``SQLQUEUE_DATABASE_URL`` set;
``LEDGER_LEASE_SECONDS`` shortens the lease for the crash test. Each task records its attempts
in the ledger (tests/apps/ledger.py), so a test sees which ran when, in which process.
"""

from __future__ import annotations

import os
import time

import sqlqueue
from tests.apps.ledger import _record_finish, _record_start

queue = sqlqueue.Queue(
    os.environ["SQLQUEUE_DATABASE_URL"],
    lease_seconds=float(os.environ.get("LEDGER_LEASE_SECONDS", "30")),
)
_engine = queue.engine
_no_wait = sqlqueue.schedule([0])


@queue.task("limits.global", backoff=_no_wait, concurrency=sqlqueue.Concurrency(limit=3))
def limited(key: str, seconds: float, first_seconds: float | None = None) -> None:
    """At most three at once across all workers; sleeps ``seconds`` (``first_seconds`` on
    attempt 1: the test's victim hangs until its worker is killed)."""
    ledger_id, attempt = _record_start(_engine, key, finished=False)
    time.sleep(first_seconds if attempt == 1 and first_seconds is not None else seconds)
    _record_finish(_engine, ledger_id)


@queue.task(
    "limits.tenant",
    backoff=_no_wait,
    concurrency=sqlqueue.Concurrency(limit=2, key=lambda payload: str(payload["tenant"])),
)
def per_tenant(key: str, tenant: str, seconds: float) -> None:
    """At most two at once per tenant across all workers."""
    ledger_id, _ = _record_start(_engine, key, finished=False)
    time.sleep(seconds)
    _record_finish(_engine, ledger_id)
