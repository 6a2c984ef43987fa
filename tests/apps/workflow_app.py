"""The queue that worker processes serve in the workflow process tests
(``tests/test_workflows_processes.py``).

``python -m sqlqueue worker tests.apps.workflow_app:queue`` with ``SQLQUEUE_DATABASE_URL`` set;
``LEDGER_LEASE_SECONDS`` shortens the lease of the worker the crash test kills, and
``LEDGER_REAPER_INTERVAL`` makes its survivors reap it at once (tests/apps/reaping.py). A step
appends a row to ``test_workflow_runs`` as it starts (autocommitted, on the database clock, so a
test sees what ran, killed attempts included). A ``wf.step`` also appends one to
``test_workflow_successes`` in the transaction that completes it (``ctx.transaction()``):
exactly one such row per step is "succeeded exactly once". A ``wf.plain`` step just returns, so
the worker completes it as most handlers are completed (on PostgreSQL the folded statement of
``sqlqueue/_store/settled_completion.py``).
"""

from __future__ import annotations

import os
import time

import sqlalchemy as sa

import sqlqueue
from sqlqueue._types import UtcDateTime
from sqlqueue.dialects import dialect_for
from tests.apps import UNOPENED_DATABASE
from tests.apps.reaping import reap_as_the_environment_says

__all__ = ["RUNS", "SUCCESSES", "create_tables", "queue", "register_workflow_tasks"]

_metadata = sa.MetaData()

RUNS = sa.Table(
    "test_workflow_runs",
    _metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("job_id", sa.BigInteger, nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
    sa.Column("started_at", UtcDateTime, nullable=False),
)

SUCCESSES = sa.Table(
    "test_workflow_successes",
    _metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("job_id", sa.BigInteger, nullable=False),
)


def create_tables(engine: sa.Engine) -> None:
    """Create the tables the handlers write (the test owns them, not sqlqueue's migrations)."""
    _metadata.create_all(engine)


def register_workflow_tasks(queue: sqlqueue.Queue) -> None:
    """Register the workflow test steps on ``queue``; its engine also writes their tables."""
    engine = queue.engine

    @queue.task("wf.step", backoff=sqlqueue.schedule([0]))
    def step(ctx: sqlqueue.JobContext, seconds: float = 0.0) -> None:
        """Record the start on the database clock, run ``seconds``, record the success."""
        clock = dialect_for(engine).clock()
        with engine.begin() as conn:
            conn.execute(RUNS.insert().values(job_id=ctx.job_id, pid=os.getpid(), started_at=clock))
        time.sleep(seconds)
        with ctx.transaction() as conn:
            conn.execute(SUCCESSES.insert().values(job_id=ctx.job_id))

    @queue.task("wf.plain", backoff=sqlqueue.schedule([0]))
    def plain(ctx: sqlqueue.JobContext, seconds: float = 0.0) -> None:
        """Record the start on the database clock, run ``seconds``, return: the worker's own
        completion ends it (and releases the steps after it)."""
        clock = dialect_for(engine).clock()
        with engine.begin() as conn:
            conn.execute(RUNS.insert().values(job_id=ctx.job_id, pid=os.getpid(), started_at=clock))
        time.sleep(seconds)

    _ = step, plain


reap_as_the_environment_says()
queue = sqlqueue.Queue(
    os.environ.get("SQLQUEUE_DATABASE_URL", UNOPENED_DATABASE),
    lease_seconds=float(os.environ.get("LEDGER_LEASE_SECONDS", "30")),
)
register_workflow_tasks(queue)
