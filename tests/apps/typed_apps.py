"""Apps that share the ``default`` queue of one database but know different job types, for the
process tests of workers that never claim a type they have no task for.

``python -m sqlqueue worker tests.apps.typed_apps:app_a`` serves ``typed.a`` only,
``…:app_b`` ``typed.b`` only, ``…:old_release`` ``typed.a`` (a release from before ``typed.b``
existed) and ``…:new_release`` both, all with ``SQLQUEUE_DATABASE_URL`` set. Each execution
appends one row to the ledger table (``tests/apps/ledger.py``) with the job's id and attempt
and the worker's pid, so a test tells from rows which process ran what.
"""

from __future__ import annotations

import os

import sqlqueue
from tests.apps.ledger import LEDGER

__all__ = ["app_a", "app_b", "forgot_tasks", "new_release", "old_release", "register"]


def register(queue: sqlqueue.Queue, *job_types: str) -> None:
    """Register a task for each of ``job_types`` on ``queue``: one ledger row per execution."""
    engine = queue.engine

    def record(ctx: sqlqueue.JobContext) -> None:
        with engine.begin() as conn:  # the ledger's times are not read here
            conn.execute(
                LEDGER.insert().values(
                    job_id=ctx.job_id, attempt=ctx.attempt, pid=os.getpid(), started=0.0
                )
            )

    for job_type in job_types:
        queue.task(job_type)(record)


_url = os.environ["SQLQUEUE_DATABASE_URL"]
app_a = sqlqueue.Queue(_url)
register(app_a, "typed.a")
app_b = sqlqueue.Queue(_url)
register(app_b, "typed.b")
old_release = sqlqueue.Queue(_url)
register(old_release, "typed.a")
new_release = sqlqueue.Queue(_url)
register(new_release, "typed.a", "typed.b")
#: A module that forgot to import its tasks: no worker may start on it.
forgot_tasks = sqlqueue.Queue(_url)
