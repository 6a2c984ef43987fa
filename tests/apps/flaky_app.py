"""The queue of the flaky-database process test: ``python -m sqlqueue worker
tests.apps.flaky_app:queue`` with ``SQLQUEUE_DATABASE_URL`` set.

With ``FLAKY_FAILURE_RATE=R`` (and ``FLAKY_SEED``), a share ``R`` of every statement on the
queue's engine — the worker's claims, outcome writes, heartbeats, upkeep, and the handler's own
transaction — raises a real transient driver error (tests/apps/statement_faults.py). The
``flaky.effect`` task writes its effect row inside ``ctx.transaction()``, so the effect lands
exactly when the job's success does.
"""

from __future__ import annotations

import os

import sqlqueue
from tests.apps.flaky_effects import EFFECTS
from tests.apps.statement_faults import fail_at_random

__all__ = ["queue"]

queue = sqlqueue.Queue(os.environ["SQLQUEUE_DATABASE_URL"], lease_seconds=3.0)


@queue.task("flaky.effect", max_attempts=100, backoff=sqlqueue.schedule([0]))
def effect(ctx: sqlqueue.JobContext) -> None:
    """Write this job's effect in the job's own transaction."""
    with ctx.transaction() as conn:
        conn.execute(
            EFFECTS.insert().values(job_id=ctx.job_id, attempt=ctx.attempt, pid=os.getpid())
        )


_rate = float(os.environ.get("FLAKY_FAILURE_RATE", "0"))
if _rate:
    fail_at_random(queue.engine, _rate, int(os.environ.get("FLAKY_SEED", "31")) + os.getpid())
