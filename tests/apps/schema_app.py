"""The queue that worker processes in the schema tests serve.

``python -m sqlqueue worker tests.apps.schema_app:queue --schema a`` with
``SQLQUEUE_DATABASE_URL`` set: the Queue is built without a schema, so the command line picks
the tables. Each ``note`` writes a row to the app's own table ``schema_notes``, in the job's
transaction, saying which schema's worker ran it: the app's table stays where the app put it.
"""

from __future__ import annotations

import os

import sqlqueue
from tests.apps.schema_notes import NOTES

queue = sqlqueue.Queue(os.environ["SQLQUEUE_DATABASE_URL"])


@queue.task("note", queue="notes")
def note(label: str, ctx: sqlqueue.JobContext) -> None:
    """Record that the worker of ``ctx.schema`` ran this job, committed with its success."""
    with ctx.transaction() as conn:
        conn.execute(NOTES.insert().values(job_id=ctx.job_id, schema=ctx.schema, label=label))


@queue.task("doomed", queue="notes", max_attempts=1)
def doomed(label: str) -> None:
    """Always fails, with no retry: a dead job for the operators' commands."""
    raise RuntimeError(f"doomed {label}")
