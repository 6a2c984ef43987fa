"""The queue that worker processes serve in the batch process tests
(``tests/test_batches_processes.py``).

``python -m sqlqueue worker tests.apps.batch_app:queue`` with ``SQLQUEUE_DATABASE_URL`` set;
``LEDGER_LEASE_SECONDS`` shortens the lease for the crash test. Children append one row per
execution to ``test_batch_runs`` (autocommitted as they start, so a test sees what ran, killed
attempts included); a callback writes what its ``ctx.batch`` said to ``test_batch_callbacks``
in the transaction that completes it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

import sqlqueue
from tests.apps import UNOPENED_DATABASE

__all__ = ["CALLBACKS", "RUNS", "create_tables", "queue", "register_batch_tasks"]

_metadata = sa.MetaData()

RUNS = sa.Table(
    "test_batch_runs",
    _metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("job_id", sa.BigInteger, nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
)

CALLBACKS = sa.Table(
    "test_batch_callbacks",
    _metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("job_id", sa.BigInteger, nullable=False),
    sa.Column("job_type", sa.String(100), nullable=False),
    sa.Column("batch_id", sa.BigInteger, nullable=False),
    sa.Column("total", sa.Integer, nullable=False),
    sa.Column("succeeded", sa.Integer, nullable=False),
    sa.Column("dead", sa.Integer, nullable=False),
    sa.Column("cancelled", sa.Integer, nullable=False),
    sa.Column("pending", sa.Integer, nullable=False),
)


def create_tables(engine: sa.Engine) -> None:
    """Create the tables the handlers write (the test owns them, not sqlqueue's migrations)."""
    _metadata.create_all(engine)


def register_batch_tasks(queue: sqlqueue.Queue) -> None:
    """Register the batch test tasks on ``queue``; its engine also writes their tables."""
    engine = queue.engine
    no_retry_wait = sqlqueue.schedule([0])

    def record_run(ctx: sqlqueue.JobContext) -> None:
        with engine.begin() as conn:
            conn.execute(
                RUNS.insert().values(job_id=ctx.job_id, attempt=ctx.attempt, pid=os.getpid())
            )

    @queue.task("batch.child", backoff=no_retry_wait)
    def child(n: int, ctx: sqlqueue.JobContext, seconds: float = 0.0) -> int:
        """Run for ``seconds``; the result is ``n``."""
        record_run(ctx)
        time.sleep(seconds)
        return n

    @queue.task("batch.doomed", max_attempts=1)
    def doomed(n: int, ctx: sqlqueue.JobContext) -> None:
        """Fail at once, with no attempt left: the job is dead."""
        record_run(ctx)
        raise RuntimeError(f"child {n} fails for good")

    @queue.task("batch.gated", backoff=no_retry_wait)
    def gated(n: int, gate: str, ctx: sqlqueue.JobContext) -> int:
        """Run until the file ``gate`` exists (at most a minute): the test ends several
        children at the same moment."""
        record_run(ctx)
        opened = Path(gate)
        deadline = time.monotonic() + 60
        while not opened.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{gate} was never created")
            time.sleep(0.002)
        return n

    @queue.task("batch.fan", backoff=no_retry_wait)
    def fan(parts: int, ctx: sqlqueue.JobContext) -> list[int]:
        """Add ``parts`` children to this job's batch."""
        record_run(ctx)
        requests = [
            sqlqueue.JobRequest(job_type="batch.child", payload={"n": 1000 + i, "seconds": 0.05})
            for i in range(parts)
        ]
        return ctx.add_to_batch(requests)

    def callback(job_type: str) -> Any:
        def run(ctx: sqlqueue.JobContext) -> None:
            batch = ctx.batch
            assert batch is not None, f"callback job {ctx.job_id} sees no batch"
            with ctx.transaction() as conn:
                conn.execute(
                    CALLBACKS.insert().values(
                        job_id=ctx.job_id,
                        job_type=job_type,
                        batch_id=batch.id,
                        total=batch.total,
                        succeeded=batch.succeeded,
                        dead=batch.dead,
                        cancelled=batch.cancelled,
                        pending=batch.pending,
                    )
                )

        return run

    queue.task("batch.done", queue="callbacks")(callback("batch.done"))
    queue.task("batch.failed", queue="callbacks")(callback("batch.failed"))
    _ = (child, doomed, gated, fan)


queue = sqlqueue.Queue(
    os.environ.get("SQLQUEUE_DATABASE_URL", UNOPENED_DATABASE),
    lease_seconds=float(os.environ.get("LEDGER_LEASE_SECONDS", "30")),
)
register_batch_tasks(queue)
