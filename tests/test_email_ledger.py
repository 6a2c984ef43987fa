"""The email ledger row lives or dies with the job's completion: it is written in the same
transaction, so a completion that fails takes the ledger row (and the follow-up job of a
deferred recipient) with it, and the retry sends again.

A ledger written in a transaction of its own would survive the failed completion: the retry
would find it, send nothing, and the deferred recipient's follow-up job, rolled back with the
completion, would be lost for good. The completion is made to fail with a real driver error:
a SQLAlchemy event on the queue's real async engine points the completion's ``UPDATE``, the
first one after the ledger's ``INSERT``, at a table that does not exist, once.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import sqlalchemy as sa

import sqlqueue
from sqlqueue._schema import email_sent, jobs
from tests.conftest import Backend
from tests.smtp_server import SMTPServer
from tests.test_email import ledger, new_mailer, run_until_final, send
from tests.test_email import queues as queues

pytestmark = pytest.mark.timeout(120)

_LEDGER_INSERT = re.compile(rf"^\s*INSERT\s+INTO\s+\S*{email_sent.name}\b", re.IGNORECASE)
#: The completion's UPDATE of the job row: a statement of its own, or after a WITH (PostgreSQL).
_JOB_UPDATE = re.compile(rf"(\bUPDATE\s+\S*?){jobs.name}\b", re.IGNORECASE)


@contextmanager
def completion_failing_once(queue: sqlqueue.Queue) -> Iterator[list[str]]:
    """Make the first job ``UPDATE`` on the queue's async engine (where the attempt's
    transaction runs) after a ledger ``INSERT`` (on any engine and connection: wherever the
    code under test writes it) fail in the database, its table renamed to one that does not
    exist; yields the list the failed statement is put in."""
    failed: list[str] = []
    inserted: list[str] = []
    target = queue.async_engine().sync_engine

    def before(
        conn: sa.Connection, cursor: Any, statement: str, parameters: Any, context: Any, many: bool
    ) -> tuple[str, Any]:
        if _LEDGER_INSERT.match(statement):
            inserted.append(statement)
        elif inserted and not failed and conn.engine is target and _JOB_UPDATE.search(statement):
            failed.append(statement)
            statement = _JOB_UPDATE.sub(rf"\g<1>{jobs.name}_not_there", statement, count=1)
        return statement, parameters

    sa.event.listen(sa.engine.Engine, "before_cursor_execute", before, retval=True)
    try:
        yield failed
    finally:
        sa.event.remove(sa.engine.Engine, "before_cursor_execute", before)


def test_a_failed_completion_takes_the_ledger_row_and_the_follow_up_with_it(
    backend: Backend, queues: list[sqlqueue.Queue]
) -> None:
    smtp = SMTPServer(refuse={"bob@example.com": "452 4.5.3 Too many recipients"})
    with smtp.running() as port:
        queue, mailer = new_mailer(backend, queues, port)
        job_id = send(backend, mailer, to=["ada@example.com", "bob@example.com"])
        with completion_failing_once(queue) as failed:
            job = run_until_final(queue, job_id)
    assert failed, "the completion never ran after the ledger insert"
    assert job.status == "succeeded"
    assert job.attempts == 2
    assert f"{jobs.name}_not_there" in job.errors[0].error  # the driver's own error
    # The retry sent again: the first copy's ledger row went with the failed completion.
    assert smtp.data_commands == 2
    assert [received.recipients for received in smtp.received] == [["ada@example.com"]] * 2
    rows = ledger(backend.engine)
    assert [(row["key"], row["job_id"]) for row in rows] == [(job.payload["key"], job_id)]
    # Bob's follow-up job, enqueued with the successful completion, is there, once.
    follow_up_id = job.result["deferred_job"]
    follow_up = queue.get_job(follow_up_id)
    assert follow_up is not None
    assert follow_up.payload["recipients"] == ["bob@example.com"]
    with backend.engine.connect() as conn:
        follow_ups = conn.execute(
            sa.select(sa.func.count()).select_from(jobs).where(jobs.c.id != job_id)
        ).scalar_one()
    assert follow_ups == 1
