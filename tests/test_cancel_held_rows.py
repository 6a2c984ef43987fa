"""``cancel_where`` meeting waiting jobs whose rows another transaction holds: it waits for
that transaction, then cancels every job still waiting and leaves those it claimed to run.

It used to skip held rows (``SKIP LOCKED``) as if a worker were taking each. On MariaDB a claim
for a worker of several queues locks every due job of them until its round commits and leases
only the first few, so an operator's ``cancel_where`` that met such a round cancelled nothing
and said 0 while the jobs stayed queued (``tests/test_batches_processes.py``'s operator test
failed so). The holder here does what that claim does, on every backend: it locks two jobs and
leases the first.
"""

from __future__ import annotations

import threading

import sqlalchemy as sa

from sqlqueue import JobRequest
from sqlqueue._schema import jobs
from sqlqueue._store import claim
from tests._support import wait_until
from tests._support.locks import someone_waits_for_a_lock
from tests.conftest import Backend


def test_cancel_where_waits_for_held_jobs_and_cancels_those_still_waiting(
    backend: Backend,
) -> None:
    queue = backend.queue()
    queue.task("child")(lambda n=0: None)
    dialect = queue.dialect
    requests = [JobRequest(job_type="child", payload={"n": n}) for n in range(3)]
    with queue.engine.begin() as conn:
        batch = queue.enqueue_batch(conn, requests)
    claimed_id, held_id, free_id = batch.job_ids
    results: list[int] = []
    errors: list[BaseException] = []

    def cancel_children() -> None:
        try:
            results.append(queue.cancel_where(job_type="child"))
        except BaseException as error:
            errors.append(error)

    def cancel_waits_or_ended() -> bool:
        if results or errors or not dialect.supports_row_locks:
            return True  # without row locks (SQLite) the one writer makes it wait all the same
        return someone_waits_for_a_lock(queue.engine)

    canceller = threading.Thread(target=cancel_children, daemon=True)
    with queue.engine.connect() as conn, dialect.write_transaction(conn):
        both = sa.select(jobs.c.id).where(jobs.c.id.in_([claimed_id, held_id]))
        conn.execute(dialect.lock_row(both.order_by(jobs.c.id))).all()
        claimed = claim.claim(
            conn,
            dialect,
            queues=[queue.default_queue],
            job_types=None,
            limit=1,
            worker_id="w1",
            lease_seconds=600,
        )
        canceller.start()
        wait_until(cancel_waits_or_ended, timeout=20, what="the cancel to wait for a row or end")
        conn.commit()
    canceller.join(30)

    assert not canceller.is_alive()
    assert errors == []
    assert [job.id for job in claimed] == [claimed_id]
    assert results == [2]  # the held job too, once its holder let it go
    with queue.engine.connect() as conn:
        statuses = dict(conn.execute(sa.select(jobs.c.id, jobs.c.status)).all())
    assert statuses == {claimed_id: "running", held_id: "cancelled", free_id: "cancelled"}
    status = queue.get_batch(batch.id)
    assert status is not None
    assert (status.cancelled, status.pending) == (2, 1)
