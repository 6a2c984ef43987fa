"""What a prune must keep while it is fast, on every backend: a worker process running
alongside loses no job and the counts stay exact; the retention window holds to the
millisecond at its boundary; the operators' actions on pruned jobs go with them, and only
theirs (a finished batch's row going with its last job: tests/test_batches_operators.py)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from sqlqueue._schema import job_actions, jobs
from sqlqueue.testing import age_jobs
from tests._support import count_jobs, drain, enqueue
from tests.apps.processes import WorkerProcess, child_env, wait_until
from tests.conftest import Backend
from tests.test_operations import expected, stats_counts
from tests.test_operations_processes import FAST_POLL, OPS_APP, local_queue

pytestmark = pytest.mark.timeout(180)


def test_a_prune_while_a_worker_process_runs_jobs_loses_none_and_counts_stay_exact(
    backend: Backend, tmp_path: Path
) -> None:
    queue = local_queue(backend)
    old = enqueue(queue, "mail_job", 400) + enqueue(queue, "report_job", 100)
    drain(queue, concurrency=50)
    age_jobs(queue, old, by=timedelta(days=2))
    queue.admin.fold_all_counts(margin=0)  # the old jobs are in the rollup: prune subtracts
    fresh = enqueue(queue, "mail_job", 300) + enqueue(queue, "report_job", 300)

    worker = WorkerProcess(
        [OPS_APP, "--queues", "mail,reports", *FAST_POLL],
        child_env(backend.url),
        tmp_path / "worker.log",
    )
    try:
        worker.wait_ready()
        wait_until(  # the worker is at it when the prune starts
            lambda: count_jobs(backend.engine, status="succeeded") > len(old),
            timeout=60,
            what="the worker to finish a first job",
            explain=worker.describe,
        )
        pruned = queue.prune(older_than=86400, batch_size=7)
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
    assert {job.id for job in queue.jobs(limit=1000)} == set(fresh)  # none lost, none twice
    assert stats_counts(queue) == expected(backend.engine)
    queue.admin.fold_all_counts(margin=0)
    assert stats_counts(queue) == expected(backend.engine)


def _finished_at(backend: Backend, job_id: int) -> object:
    with backend.engine.connect() as conn:
        return conn.execute(sa.select(jobs.c.finished_at).where(jobs.c.id == job_id)).scalar_one()


def test_the_retention_window_holds_at_its_boundary(backend: Backend) -> None:
    queue = local_queue(backend)
    [job] = enqueue(queue, "mail_job", 1)
    drain(queue)
    finished = _finished_at(backend, job)
    assert isinstance(finished, type(queue.database_now()))
    kept = 3600.0

    # Exactly ``kept`` seconds after it finished, the job is still inside the window…
    at_edge = queue.admin.prune_batch(
        status="succeeded", older_than=kept, limit=10, now=finished + timedelta(seconds=kept)
    )
    assert at_edge == 0
    assert queue.get_job(job) is not None
    # …and a millisecond later it is out (SQLite keeps milliseconds, the servers more).
    past = finished + timedelta(seconds=kept, milliseconds=1)
    assert queue.admin.prune_batch(status="succeeded", older_than=kept, limit=10, now=past) == 1
    assert queue.get_job(job) is None


def _actions_of(backend: Backend, ids: list[int]) -> set[int]:
    query = sa.select(job_actions.c.job_id).where(job_actions.c.job_id.in_(ids))
    with backend.engine.connect() as conn:
        return set(conn.execute(query).scalars())


def test_a_prune_takes_the_actions_of_its_jobs_and_no_others(backend: Backend) -> None:
    queue = local_queue(backend)
    cancelled = enqueue(queue, "report_job", 6)
    for job_id in cancelled:  # an operator's cancel: one action row per job
        queue.cancel(job_id, by="ops", reason="warehouse moved")
    old = cancelled[::2]  # every other one: kept jobs' ids lie between the deleted ones
    age_jobs(queue, old, by=timedelta(days=2))

    assert queue.prune(older_than=86400, statuses=["cancelled"], batch_size=2) == len(old)
    assert _actions_of(backend, cancelled) == set(cancelled) - set(old)
    assert [a.action for a in queue.job_actions(cancelled[1])] == ["cancel"]
    assert queue.prune(older_than=0, statuses=["cancelled"]) == len(cancelled) - len(old)
    assert _actions_of(backend, cancelled) == set()
