"""The partitioned history (backends with ``supports_history_partitions``: PostgreSQL): moving
succeeded jobs out of the hot table changes no read, leaves alone what something can still act
on, and dropping its days keeps the counts exact and leaves no tag or action behind."""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command

import sqlqueue
from sqlqueue._errors import JobStateError
from sqlqueue._migrate import alembic_config
from sqlqueue._schema import job_actions, job_tags, jobs, jobs_history
from sqlqueue._worker.retention import RetentionDuty
from sqlqueue.dialects import history_partitions_of
from sqlqueue.testing import age_jobs
from tests._support import count_jobs, drain, enqueue
from tests.apps.processes import WorkerProcess, child_env, wait_until
from tests.conftest import Backend
from tests.test_operations import stats_counts
from tests.test_operations_processes import FAST_POLL, OPS_APP, local_queue

pytestmark = pytest.mark.timeout(180)

#: Old enough to move (past ``history_after``) and to drop (a day past a day's retention).
AGED = timedelta(days=2)


def _moved(backend: Backend) -> set[int]:
    with backend.engine.connect() as conn:
        return set(conn.execute(sa.select(jobs_history.c.id)).scalars())


def _move_all(queue: sqlqueue.Queue) -> int:
    moved = 0
    while count := queue.admin.move_to_history(after=300, keep=None, limit=50):
        moved += count
    return moved


def _finished_old(queue: sqlqueue.Queue, ids: list[int]) -> None:
    """Run ``ids``, age them past the mover's wait, and count them into the rollup."""
    drain(queue, concurrency=20)
    age_jobs(queue, ids, by=AGED)
    queue.admin.fold_all_counts(margin=0)


def _reads(queue: sqlqueue.Queue, ids: list[int]) -> dict[str, object]:
    """What an operator or an app reads of ``ids``: each job, a page, filtered pages, counts,
    the stats."""
    return {
        "jobs": [queue.get_job(job_id) for job_id in ids],
        "page": queue.jobs(limit=1000),
        "tagged": queue.jobs(tag="t:1", limit=1000),
        "succeeded": queue.jobs(status="succeeded", job_type="mail_job", limit=1000),
        "count": queue.count_jobs(status="succeeded"),
        "stats": stats_counts(queue),
    }


def test_moving_succeeded_jobs_changes_no_read(backend: Backend) -> None:
    backend.requires("history_partitions")
    queue = local_queue(backend)
    with queue.engine.begin() as conn:
        tagged = [queue.enqueue(conn, "mail_job", {"n": n}, tags=["t:1"]) for n in range(5)]
    ids = tagged + enqueue(queue, "mail_job", 30) + enqueue(queue, "report_job", 20)
    _finished_old(queue, ids)
    before = _reads(queue, ids)

    assert _move_all(queue) == len(ids)

    assert _moved(backend) == set(ids)
    assert count_jobs(backend.engine) == 0  # the hot table is empty
    assert _reads(queue, ids) == before
    queue.admin.reset_counts()  # the rollup forgotten: moved jobs are counted again
    assert stats_counts(queue) == before["stats"]
    queue.admin.fold_all_counts(margin=0)
    assert stats_counts(queue) == before["stats"]


def test_what_something_can_still_act_on_never_moves(backend: Backend) -> None:
    backend.requires("history_partitions")
    queue = local_queue(backend)
    plain = enqueue(queue, "mail_job", 3)
    with queue.engine.begin() as conn:
        keyed = queue.enqueue(conn, "mail_job", {"n": 9}, idempotency_key="order-9")
        unique = queue.enqueue(conn, "mail_job", {"n": 10}, unique=sqlqueue.Unique(by=("n",)))
        in_batch = queue.enqueue_batch(
            conn, [sqlqueue.JobRequest(job_type="mail_job", payload={"n": 11})]
        )
    dead = enqueue(queue, "doomed", 2)
    cancelled = enqueue(queue, "mail_job", 2)
    for job_id in cancelled:
        queue.cancel(job_id)
    _finished_old(queue, [*plain, keyed, unique, *dead, *cancelled, *_batch_jobs(backend)])
    recent = enqueue(queue, "mail_job", 2)
    drain(queue)  # finished just now: not yet

    _move_all(queue)

    assert _moved(backend) == set(plain)
    assert in_batch is not None
    for job_id in (keyed, unique, *dead, *cancelled, *recent):
        assert count_jobs(backend.engine, id=job_id) == 1


def test_nothing_moves_before_the_rollup_counted_it(backend: Backend) -> None:
    backend.requires("history_partitions")
    queue = local_queue(backend)
    ids = enqueue(queue, "mail_job", 4)
    drain(queue)
    age_jobs(queue, ids, by=AGED)  # old enough, but the rollup forgot them (age_jobs resets it)

    assert _move_all(queue) == 0
    queue.admin.fold_all_counts(margin=0)
    assert _move_all(queue) == len(ids)


def _batch_jobs(backend: Backend) -> list[int]:
    with backend.engine.connect() as conn:
        query = sa.select(jobs.c.id).where(jobs.c.batch_id.is_not(None))
        return list(conn.execute(query).scalars())


def test_an_idempotency_key_still_returns_its_job_after_the_mover_ran(backend: Backend) -> None:
    backend.requires("history_partitions")
    queue = local_queue(backend)
    with queue.engine.begin() as conn:
        first = queue.enqueue(conn, "mail_job", {"n": 1}, idempotency_key="invoice-1")
    _finished_old(queue, [first])
    _move_all(queue)

    with queue.engine.begin() as conn:
        again = queue.enqueue(conn, "mail_job", {"n": 1}, idempotency_key="invoice-1")

    assert again == first
    assert count_jobs(backend.engine) == 1


def test_an_action_on_a_moved_job_says_it_succeeded(backend: Backend) -> None:
    backend.requires("history_partitions")
    queue = local_queue(backend)
    [job_id] = enqueue(queue, "mail_job", 1)
    _finished_old(queue, [job_id])
    _move_all(queue)

    with pytest.raises(JobStateError, match="succeeded"):
        queue.cancel(job_id)
    with pytest.raises(JobStateError, match="succeeded"):
        queue.requeue(job_id, by="ops", reason="again")


def test_dropping_days_keeps_counts_exact_and_leaves_no_tags_or_actions(
    backend: Backend,
) -> None:
    backend.requires("history_partitions")
    queue = local_queue(backend)
    with queue.engine.begin() as conn:
        old = [queue.enqueue(conn, "mail_job", {"n": n}, tags=["old"]) for n in range(8)]
    old += enqueue(queue, "report_job", 5)
    now = queue.database_now()
    queue.reschedule(old[0], now, by="ops", reason="sooner")  # an action on a job that goes
    _finished_old(queue, old)
    _move_all(queue)
    with queue.engine.begin() as conn:
        kept = [queue.enqueue(conn, "mail_job", {"n": n}, tags=["new"]) for n in range(4)]
    queue.reschedule(kept[0], now, by="ops", reason="sooner")
    drain(queue)
    queue.admin.fold_all_counts(margin=0)
    before = stats_counts(queue)

    pruned = queue.prune(older_than=86400, statuses=("succeeded",))

    assert pruned == len(old)
    assert _moved(backend) == set()
    with backend.engine.connect() as conn:
        left_tags = set(conn.execute(sa.select(job_tags.c.job_id)).scalars())
        acted = set(conn.execute(sa.select(job_actions.c.job_id)).scalars())
    assert left_tags == set(kept)
    assert acted == {kept[0]}
    after = stats_counts(queue)
    assert after[("succeeded", "mail")] == before[("succeeded", "mail")] - 8
    assert ("succeeded", "reports") not in after
    queue.admin.reset_counts()  # counted live from scratch: the same
    assert stats_counts(queue) == after
    assert {job.id for job in queue.jobs(limit=100)} == set(kept)


def test_the_retention_duty_moves_then_drops_days(backend: Backend) -> None:
    backend.requires("history_partitions")
    queue = local_queue(backend)
    ids = enqueue(queue, "mail_job", 12)
    _finished_old(queue, ids)
    retention = sqlqueue.Retention(succeeded=86400, batch_size=5)
    duty = RetentionDuty(queue.admin, retention, holder="test")

    # Past the succeeded retention already: nothing moves, the batched prune deletes them.
    assert duty.move() == 0
    while duty.prune("succeeded", 86400):
        pass
    assert duty.deleted == 12
    fresh = enqueue(queue, "mail_job", 6)
    _finished_old(queue, [])
    age_jobs(queue, fresh, by=timedelta(hours=1))
    queue.admin.fold_all_counts(margin=0)
    while duty.move():
        pass
    assert _moved(backend) == set(fresh)
    assert duty.drop_days() == 0  # the day they finished on is within retention


def test_a_drop_beside_a_worker_process_loses_no_job(backend: Backend, tmp_path: Path) -> None:
    backend.requires("history_partitions")
    queue = local_queue(backend)
    old = enqueue(queue, "mail_job", 300) + enqueue(queue, "report_job", 100)
    _finished_old(queue, old)
    _move_all(queue)
    fresh = enqueue(queue, "mail_job", 300) + enqueue(queue, "report_job", 300)
    worker = WorkerProcess(
        [OPS_APP, "--queues", "mail,reports", *FAST_POLL],
        child_env(backend.url),
        tmp_path / "worker.log",
    )
    try:
        worker.wait_ready()
        wait_until(
            lambda: count_jobs(backend.engine, status="succeeded") > 0,
            timeout=60,
            what="the worker to finish a first job",
            explain=worker.describe,
        )
        pruned = queue.prune(older_than=86400, statuses=("succeeded",))
        wait_until(
            lambda: count_jobs(backend.engine, status="succeeded") == len(fresh),
            timeout=90,
            what="the worker to run every fresh job",
            explain=worker.describe,
        )
        assert worker.stop() == 0, worker.describe()
    finally:
        worker.close()

    assert pruned == len(old)
    assert {job.id for job in queue.jobs(limit=1000)} == set(fresh)
    counts = stats_counts(queue)
    assert counts[("succeeded", "mail")] == 300
    assert counts[("succeeded", "reports")] == 300


def test_a_downgrade_moves_the_history_back(backend: Backend) -> None:
    backend.requires("history_partitions")
    queue = local_queue(backend)
    ids = enqueue(queue, "mail_job", 7)
    _finished_old(queue, ids)
    _move_all(queue)

    with backend.engine.begin() as conn:
        command.downgrade(alembic_config(conn), "0019")
    assert count_jobs(backend.engine, status="succeeded") == len(ids)
    assert "sqlqueue_jobs_history" not in sa.inspect(backend.engine).get_table_names()
    sqlqueue.migrate(backend.engine)
    assert _moved(backend) == set()
    assert _move_all(queue) == len(ids)


def test_a_prune_batch_keeps_the_actions_of_moved_jobs_among_its_ids(backend: Backend) -> None:
    backend.requires("history_partitions")
    queue = local_queue(backend)
    first, moving, last = enqueue(queue, "mail_job", 3)
    queue.reschedule(moving, queue.database_now(), by="ops", reason="sooner")
    queue.cancel(first)
    queue.cancel(last)
    _finished_old(queue, [first, moving, last])
    assert _move_all(queue) == 1

    # The cancelled jobs around it go in one batch, whose orphan sweep covers ids first..last.
    assert queue.prune(older_than=86400, statuses=("cancelled",)) == 2

    assert [action.action for action in queue.job_actions(moving)] == ["reschedule"]


def test_a_downgrade_moves_back_the_jobs_of_a_day_detached_by_hand(backend: Backend) -> None:
    backend.requires("history_partitions")
    queue = local_queue(backend)
    ids = enqueue(queue, "mail_job", 4)
    _finished_old(queue, ids)
    _move_all(queue)
    ddl = history_partitions_of(queue.admin.dialect)
    assert ddl is not None
    with backend.engine.begin() as conn:
        [day] = ddl.history_partitions(conn)
        conn.execute(sa.text(f"ALTER TABLE sqlqueue_jobs_history DETACH PARTITION {day.name}"))

    with backend.engine.begin() as conn:
        command.downgrade(alembic_config(conn), "0019")

    assert count_jobs(backend.engine, status="succeeded") == len(ids)
    assert not [t for t in sa.inspect(backend.engine).get_table_names() if "history" in t]
    sqlqueue.migrate(backend.engine)


def test_a_batch_either_side_of_midnight_moves_into_both_days(backend: Backend) -> None:
    backend.requires("history_partitions")
    queue = local_queue(backend)
    before, after = enqueue(queue, "mail_job", 3), enqueue(queue, "mail_job", 2)
    drain(queue)
    midnight = datetime.combine(queue.database_now().date() - timedelta(days=1), time(), UTC)
    with backend.engine.begin() as conn:
        for group, finished in ((before, midnight - timedelta(seconds=30)), (after, midnight)):
            conn.execute(sa.update(jobs).where(jobs.c.id.in_(group)).values(finished_at=finished))
    queue.admin.reset_counts()
    queue.admin.fold_all_counts(margin=0)

    assert queue.admin.move_to_history(after=300, keep=None, limit=50) == 5

    ddl = history_partitions_of(queue.admin.dialect)
    assert ddl is not None
    with backend.engine.connect() as conn:
        days = [p.day for p in ddl.history_partitions(conn)]
        where = sa.select(jobs_history.c.id).where
        late = set(conn.execute(where(jobs_history.c.finished_at >= midnight)).scalars())
    assert days == [midnight.date() - timedelta(days=1), midnight.date()]
    assert _moved(backend) == {*before, *after}
    assert late == set(after)
