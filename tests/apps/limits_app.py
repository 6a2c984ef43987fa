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
from tests.apps.uninterrupted import uninterrupted

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


@queue.task(
    "limits.blocking",
    max_attempts=1,
    timeout=0.5,
    concurrency=sqlqueue.Concurrency(limit=1),
)
def blocking(key: str, seconds: float) -> None:
    """One at a time across all workers; blocks ``seconds`` in a call no interrupt cuts short
    (here a thread's join, as a socket read would), past its timeout. Its ledger rows are
    written in that call, so the timeout's interrupt cuts neither: the start (a write can take
    longer than the timeout on a loaded machine), nor the finish, recorded when the blocking
    part ends, which is when the handler really returns."""

    def block() -> None:
        ledger_id, _ = _record_start(_engine, key, finished=False)
        try:
            time.sleep(seconds)
        finally:
            _record_finish(_engine, ledger_id)

    uninterrupted(block)
