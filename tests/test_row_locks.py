"""Claims skip the rows other transactions hold (``SKIP LOCKED``), where writers lock rows.

A claim that waited for a held row instead would not fail, only stall, so the test makes the
wait fatal: the claiming transaction first locks a row the holder then asks for. Had the claim
waited for the holder's row, each would wait on the other and the database's deadlock detector
would fail one of them: an error (or the held row claimed), never a wall-clock threshold.
"""

from __future__ import annotations

import threading

import sqlalchemy as sa

from sqlqueue._schema import jobs
from sqlqueue._store import claim
from sqlqueue.dialects import dialect_for


def _lock(job_id: int) -> sa.Select[tuple[int]]:
    return sa.select(jobs.c.id).where(jobs.c.id == job_id).with_for_update()


def test_a_claim_takes_the_next_due_job_past_one_another_transaction_holds(backend):
    backend.requires("row_locks")
    queue = backend.queue()

    @queue.task("work")
    def work(n: int) -> None:
        pass

    with backend.engine.begin() as conn:
        oldest = queue.enqueue(conn, "work", {"n": 1})
        following = queue.enqueue(conn, "work", {"n": 2})
        not_due = queue.enqueue(conn, "work", {"n": 3}, delay=3600)

    holder = backend.engine.connect()
    claimer = backend.engine.connect()
    holder_errors: list[BaseException] = []

    def ask_for_the_claimers_row() -> None:
        try:
            holder.execute(_lock(not_due)).all()
        except BaseException as error:
            holder_errors.append(error)

    asking = threading.Thread(target=ask_for_the_claimers_row, daemon=True)
    try:
        holder.begin()
        holder.execute(_lock(oldest)).all()  # e.g. another worker's claim, not yet committed
        claimer.begin()
        claimer.execute(_lock(not_due)).all()
        asking.start()  # the holder now waits for the claimer until its transaction ends
        claimed = claim.claim(
            claimer,
            dialect_for(backend.engine),
            queues=[queue.default_queue],
            job_types=None,
            limit=2,
            worker_id="w1",
            lease_seconds=30,
        )
        claimer.commit()
    finally:
        claimer.close()
        asking.join(60)
        holder.rollback()
        holder.close()

    assert not asking.is_alive()
    assert holder_errors == []
    assert [job.id for job in claimed] == [following]
    assert queue.get_job(oldest).status == "queued"
    assert queue.get_job(following).status == "running"
