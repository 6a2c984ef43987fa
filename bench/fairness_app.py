"""The application the fairness benchmark's workers serve: one task of many tenants, limited to
``SQLQUEUE_BENCH_TENANT_LIMIT`` running jobs per tenant (0: no limit), each job a short sleep.

``python -m sqlqueue worker bench.fairness_app:queue``; the database comes from
``SQLQUEUE_DATABASE_URL``, which the benchmark sets.
"""

from __future__ import annotations

import os
import time

import sqlqueue
from bench.names import TENANT_JOB

__all__ = ["queue"]

_url = os.environ.get("SQLQUEUE_DATABASE_URL")
if not _url:
    raise SystemExit("bench.fairness_app needs SQLQUEUE_DATABASE_URL (the benchmark sets it)")
_limit = int(os.environ.get("SQLQUEUE_BENCH_TENANT_LIMIT", "0"))
_work = float(os.environ.get("SQLQUEUE_BENCH_WORK_SECONDS", "0.005"))

queue = sqlqueue.Queue(_url)


@queue.task(
    TENANT_JOB,
    concurrency=sqlqueue.Concurrency(limit=_limit, key=lambda p: str(p["tenant"]))
    if _limit
    else None,
)
def tenant_job(tenant: str, n: int) -> None:
    """A little work (a sleep), so the backlog takes a while to drain."""
    time.sleep(_work)
