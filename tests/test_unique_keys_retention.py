"""The lock rows of unique keys are pruned once no job carries their key, on every backend:
by the workers' retention duty and by an operator's prune, and an enqueue that races the prune
still serialises with the other enqueuers of its key."""

from __future__ import annotations

from datetime import timedelta

import pytest
import sqlalchemy as sa

import sqlqueue
from sqlqueue._schema import jobs, unique_keys
from sqlqueue.testing import age_jobs
from tests._support import WorkerThread, count_jobs, drain, wait_until
from tests.conftest import Backend


def _keys(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(unique_keys)).scalar_one())


def _queue(backend: Backend, **options: object) -> tuple[sqlqueue.Queue, sqlqueue.Task]:
    queue = backend.queue(**options)

    @queue.task("sync_user", unique=sqlqueue.Unique(by=("user_id",), states=("queued",)))
    def sync_user(user_id: int) -> None:
        pass

    return queue, sync_user


def test_the_retention_duty_prunes_the_keys_no_job_carries_and_keeps_the_others(
    backend: Backend,
) -> None:
    queue, sync_user = _queue(
        backend, retention=sqlqueue.Retention(succeeded=3600, interval=0.05, batch_size=2)
    )
    with queue.engine.begin() as conn:
        old = [sync_user.enqueue(conn, user_id=user) for user in range(5)]
    drain(queue)
    with queue.engine.begin() as conn:  # user 4 has a new job: its key stays carried
        recent = sync_user.enqueue(conn, user_id=4)
    age_jobs(queue, old, by=timedelta(days=1))
    assert _keys(backend.engine) == 5

    with WorkerThread(queue.worker(poll_interval=0.02)):
        wait_until(lambda: _keys(backend.engine) == 1, timeout=15)
        wait_until(lambda: queue.get_job(recent).status == "succeeded", timeout=15)  # type: ignore[union-attr]
    assert count_jobs(backend.engine) == 1

    # A pruned key works as before: the first enqueue writes the key's row again, the next keeps.
    with queue.engine.begin() as conn:
        first = sync_user.enqueue(conn, user_id=0)
        again = sync_user.enqueue(conn, user_id=0)
    assert first == again
    assert count_jobs(backend.engine, status="queued") == 1
    assert _keys(backend.engine) == 2


def test_an_operators_prune_takes_the_keys_of_the_jobs_it_pruned(backend: Backend) -> None:
    queue, sync_user = _queue(backend)
    with queue.engine.begin() as conn:
        done = [sync_user.enqueue(conn, user_id=user) for user in range(7)]
    drain(queue)
    with queue.engine.begin() as conn:
        waiting = sync_user.options(delay=3600).enqueue(conn, user_id=100)
    age_jobs(queue, done[:5], by=timedelta(days=2))

    assert queue.prune(older_than=86400, batch_size=2) == 5
    assert _keys(backend.engine) == 3  # users 5 and 6 (their jobs remain) and the waiting one
    with queue.engine.begin() as conn:
        assert sync_user.enqueue(conn, user_id=100) == waiting


def test_an_enqueue_whose_key_row_is_pruned_under_it_writes_it_again(backend: Backend) -> None:
    if backend.name != "postgresql":
        # SQLite's write lock and MariaDB's locking ON DUPLICATE KEY UPDATE hold the key's row
        # from the enqueue's first statement: a prune cannot slip in between.
        pytest.skip(f"{backend.name} locks the key's row in the statement that writes it")
    queue, sync_user = _queue(backend)
    with queue.engine.begin() as conn:
        done = sync_user.enqueue(conn, user_id=1)
    drain(queue)
    with queue.engine.begin() as conn:
        conn.execute(sa.delete(jobs).where(jobs.c.id == done))
    assert _keys(backend.engine) == 1  # the key's row, carried by no job

    pruned: list[int] = []

    def prune_between(*event: object) -> None:
        statement = str(event[2])
        # Right after the enqueue's insert-if-absent found the row there, a prune deletes it.
        if not pruned and "INSERT INTO sqlqueue_unique_keys" in statement:
            deleted, _ = queue.admin.prune_unique_keys(after="", limit=10)
            pruned.append(deleted)

    sa.event.listen(queue.engine, "after_cursor_execute", prune_between)
    try:
        with queue.engine.begin() as conn:
            first = sync_user.enqueue(conn, user_id=1)
    finally:
        sa.event.remove(queue.engine, "after_cursor_execute", prune_between)
    assert pruned == [1]
    assert _keys(backend.engine) == 1  # written again, and held while the job is queued
    with queue.engine.begin() as conn:
        assert sync_user.enqueue(conn, user_id=1) == first
    assert count_jobs(backend.engine) == 1
