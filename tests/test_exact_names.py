"""Names compare exactly on every backend: ``"mail"`` and ``"mail "`` are two queues, two
group keys, two job types.

MariaDB's ``utf8mb4_bin`` pads with spaces when it compares, so a worker on ``mail`` ran jobs
enqueued to ``"mail "``; migration 0022 moved sqlqueue's tables to the server's NO PAD binary
collation. The same tests run on PostgreSQL and SQLite, which always compared byte for byte.
"""

from __future__ import annotations

import sqlalchemy as sa

import sqlqueue
from sqlqueue._schema import jobs
from tests._support import drain
from tests.conftest import Backend


def _job(queue: sqlqueue.Queue, job_id: int) -> sqlqueue.Job:
    """Job ``job_id``, which the test knows is there."""
    job = queue.get_job(job_id)
    assert job is not None, job_id
    return job


def test_a_worker_on_a_queue_never_runs_the_jobs_of_its_name_with_a_trailing_space(
    backend: Backend,
) -> None:
    queue = backend.queue()
    ran: list[str] = []
    queue.task("ping", queue="mail")(lambda note: ran.append(note))
    with backend.engine.begin() as conn:
        mail = queue.enqueue(conn, "ping", {"note": "mail"})
        padded = queue.enqueue(conn, "ping", {"note": "padded"}, queue="mail ")
    drain(queue, queues=["mail"])

    assert ran == ["mail"]
    assert _job(queue, mail).status.value == "succeeded"
    assert _job(queue, padded).status.value == "queued"
    assert _job(queue, padded).queue == "mail "
    assert set(queue.stats().queues) >= {"mail", "mail "}


def test_a_pause_of_a_queue_leaves_its_name_with_a_trailing_space_running(
    backend: Backend,
) -> None:
    queue = backend.queue()
    ran: list[str] = []
    queue.task("ping", queue="mail")(lambda note: ran.append(note))
    with backend.engine.begin() as conn:
        queue.enqueue(conn, "ping", {"note": "mail"})
        queue.enqueue(conn, "ping", {"note": "padded"}, queue="mail ")
    queue.pause("mail", by="ops", reason="provider down")
    drain(queue, queues=["mail", "mail "])

    assert ran == ["padded"]


def test_jobs_of_one_group_key_wait_for_each_other_and_not_for_its_padded_twin(
    backend: Backend,
) -> None:
    """Per-key ordering: with the first job of ``"acct-1"`` running, the other ``"acct-1"``
    job waits, and the ``"acct-1 "`` job (another key) is claimed beside it."""
    queue = backend.queue()
    queue.task("sync")(lambda n: None)
    with backend.engine.begin() as conn:
        first = queue.enqueue(conn, "sync", {"n": 1}, group_key="acct-1")
        second = queue.enqueue(conn, "sync", {"n": 2}, group_key="acct-1")
        twin = queue.enqueue(conn, "sync", {"n": 3}, group_key="acct-1 ")
        conn.execute(sa.update(jobs).where(jobs.c.id == first).values(status="running"))
    with backend.engine.connect() as conn:
        keys = dict(conn.execute(sa.select(jobs.c.id, jobs.c.group_key)).all())
    assert keys[twin] == "acct-1 "
    drain(queue)

    assert _job(queue, second).status.value == "queued"  # its key's first job still runs
    assert _job(queue, twin).status.value == "succeeded"
