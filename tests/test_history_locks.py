"""The partitioned history's duty beside other sessions (PostgreSQL): a move or a drop never
waits long for a lock, a drop counts exactly what it drops while a move is under way, a failed
move leaves the rest of the retention pass alone, and the mover runs only where succeeded jobs
have a retention, from where its last full pass reached."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest
import sqlalchemy as sa

import sqlqueue
from sqlqueue._schema import job_tags, jobs_history
from sqlqueue._store import history
from sqlqueue._store.history import HistoryBusy
from sqlqueue._worker.dbthread import DatabaseThread
from sqlqueue._worker.retention import RetentionDuty
from sqlqueue.dialects import history_partitions_of
from sqlqueue.testing import age_jobs
from tests._support import count_jobs, drain, enqueue
from tests.apps.processes import wait_until
from tests.conftest import Backend
from tests.test_history import AGED, _finished_old, _move_all, _moved
from tests.test_operations import stats_counts
from tests.test_operations_processes import local_queue

pytestmark = pytest.mark.timeout(180)


def _lock_waiters(backend: Backend) -> int:
    """How many sessions of this test's database wait for a lock now."""
    with backend.engine.connect() as conn:
        waiting = sa.text(
            "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE NOT l.granted AND a.datname = current_database()"
        )
        return int(conn.execute(waiting).scalar_one())


def _in_thread(call: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    """Start ``call`` in a thread; its result or exception lands in the list."""
    out: list[object] = []

    def run() -> None:
        try:
            out.append(call())
        except BaseException as error:  # handed to the test
            out.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def test_a_drop_behind_a_long_reader_of_the_history_gives_up_at_once(backend: Backend) -> None:
    backend.requires("history_partitions")
    queue = local_queue(backend)
    ids = enqueue(queue, "mail_job", 3)
    _finished_old(queue, ids)
    _move_all(queue)
    with backend.engine.connect() as reader:  # a pg_dump or a report, reading the history
        reader.execute(sa.select(sa.func.count()).select_from(jobs_history)).one()
        thread, out = _in_thread(lambda: queue.admin.drop_history_days(older_than=86400))
        thread.join(timeout=15)
        waited = thread.is_alive()
        reader.rollback()
    thread.join(timeout=30)

    assert not waited, "the drop waited for the reader without limit"
    assert len(out) == 1
    assert isinstance(out[0], HistoryBusy)
    assert _moved(backend) == set(ids)  # nothing done: it goes at the next pass
    assert queue.admin.drop_history_days(older_than=86400) == len(ids)


def test_a_move_behind_a_lock_on_the_history_gives_up_at_once(backend: Backend) -> None:
    backend.requires("history_partitions")
    queue = local_queue(backend)
    ids = enqueue(queue, "mail_job", 3)
    _finished_old(queue, ids)
    with backend.engine.connect() as holder:
        holder.execute(sa.text("LOCK TABLE sqlqueue_jobs_history IN SHARE ROW EXCLUSIVE MODE"))
        thread, out = _in_thread(lambda: _move_all(queue))
        thread.join(timeout=15)
        waited = thread.is_alive()
        holder.rollback()
    thread.join(timeout=30)

    assert not waited, "the move waited for the lock without limit"
    assert len(out) == 1
    assert isinstance(out[0], HistoryBusy)
    assert _moved(backend) == set()
    assert _move_all(queue) == len(ids)


def test_a_drop_waits_for_a_move_under_way_and_counts_what_it_drops(backend: Backend) -> None:
    backend.requires("history_partitions")
    queue = local_queue(backend)
    with queue.engine.begin() as conn:
        ids = [queue.enqueue(conn, "mail_job", {"n": n}, tags=["old"]) for n in range(10)]
    _finished_old(queue, ids)
    assert queue.admin.move_to_history(after=300, keep=None, limit=5) == 5
    dialect = queue.admin.dialect
    with backend.engine.connect() as mover:  # a second mover's batch, not yet committed
        assert history.move_batch(mover, dialect, after=300, keep=None, limit=5) == 5
        thread, out = _in_thread(lambda: queue.admin.drop_history_days(older_than=86400))
        wait_until(lambda: _lock_waiters(backend) > 0, timeout=10, what="the drop to wait")
        mover.commit()
    thread.join(timeout=30)

    assert out == [len(ids)]
    assert _moved(backend) == set()
    with backend.engine.connect() as conn:
        assert set(conn.execute(sa.select(job_tags.c.job_id)).scalars()) == set()
    after = stats_counts(queue)
    assert ("succeeded", "mail") not in after
    queue.admin.reset_counts()
    assert stats_counts(queue) == after


def _run_pass(duty: RetentionDuty) -> None:
    db = DatabaseThread()
    try:
        asyncio.run(duty.run_pass(db, lambda: False))
    finally:
        db.close()


def test_a_failing_move_does_not_stop_the_rest_of_the_pass(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    backend.requires("history_partitions")
    queue = local_queue(backend)
    moving = enqueue(queue, "mail_job", 2)
    cancelled = enqueue(queue, "mail_job", 2)
    for job_id in cancelled:
        queue.cancel(job_id)
    _finished_old(queue, [*moving, *cancelled])
    day = (queue.database_now() - AGED).date()
    with backend.engine.begin() as conn:  # a day's table detached by hand: its CREATE fails
        conn.execute(
            sa.text(
                f"CREATE TABLE sqlqueue_jobs_history_p{day:%Y%m%d} (LIKE sqlqueue_jobs_history)"
            )
        )
    retention = sqlqueue.Retention(succeeded=30 * 86400, cancelled=86400, batch_size=5)

    _run_pass(RetentionDuty(queue.admin, retention, holder="test"))

    assert count_jobs(backend.engine, status="cancelled") == 0  # the prune went on
    assert count_jobs(backend.engine, status="succeeded") == len(moving)
    assert "moving jobs into the history failed" in caplog.text


def test_without_a_succeeded_retention_nothing_moves(backend: Backend) -> None:
    backend.requires("history_partitions")
    queue = local_queue(backend)
    ids = enqueue(queue, "mail_job", 3)
    _finished_old(queue, ids)
    retention = sqlqueue.Retention(cancelled=86400)  # succeeded kept for ever: no day would go

    _run_pass(RetentionDuty(queue.admin, retention, holder="test"))

    assert _moved(backend) == set()
    ddl = history_partitions_of(queue.admin.dialect)
    assert ddl is not None
    with backend.engine.connect() as conn:
        assert ddl.history_partitions(conn) == []


def test_the_mover_starts_where_its_last_full_pass_reached(backend: Backend) -> None:
    backend.requires("history_partitions")
    queue = local_queue(backend)
    first = enqueue(queue, "mail_job", 3)
    _finished_old(queue, first)
    duty = RetentionDuty(queue.admin, sqlqueue.Retention(succeeded=30 * 86400), holder="test")
    _run_pass(duty)
    assert _moved(backend) == set(first)
    # A job that finished long before where that pass reached (it cannot happen on its own: a
    # succeeded job's key and batch never change) is not looked at again.
    late = enqueue(queue, "mail_job", 1)
    drain(queue)
    age_jobs(queue, late, by=AGED)
    queue.admin.fold_all_counts(margin=0)

    _run_pass(duty)

    assert _moved(backend) == set(first)
    duty.release()
    _run_pass(RetentionDuty(queue.admin, sqlqueue.Retention(succeeded=30 * 86400), holder="x"))
    assert _moved(backend) == {*first, *late}  # a new duty starts from the beginning
