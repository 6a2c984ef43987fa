"""A queue whose handler writes in its job's transaction and, on attempt 1, kills its own
worker process after writing and before the commit (a real SIGKILL, mid-transaction)."""

from __future__ import annotations

import os
import signal

import sqlalchemy as sa

import sqlqueue
from tests.apps import UNOPENED_DATABASE

metadata = sa.MetaData()
ledger = sa.Table(
    "context_ledger",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("job_id", sa.Integer, nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False),
)

queue = sqlqueue.Queue(
    os.environ.get("SQLQUEUE_DATABASE_URL", UNOPENED_DATABASE),  # importable by the test itself
    lease_seconds=float(os.environ.get("CONTEXT_LEASE_SECONDS", "1.5")),
)


@queue.task("write_then_die")
def write_then_die(ctx: sqlqueue.JobContext) -> str:
    with ctx.transaction() as conn:
        conn.execute(ledger.insert().values(job_id=ctx.job_id, attempt=ctx.attempt))
    if ctx.attempt == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return f"written on attempt {ctx.attempt}"
