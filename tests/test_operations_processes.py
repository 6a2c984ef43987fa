"""Operations across real processes, on both backends: a pause reaches every worker process,
retention runs as a duty of one worker at a time, and two processes requeueing the same dead
jobs at once make one new job each."""

from __future__ import annotations

import re
import subprocess
import sys
from datetime import timedelta
from functools import partial
from pathlib import Path

import pytest

import sqlqueue
from sqlqueue.testing import age_jobs
from tests._support import count_jobs, drain, enqueue
from tests.apps.processes import REPO_ROOT, WorkerProcess, Workers, child_env, wait_until
from tests.conftest import Backend

pytestmark = pytest.mark.timeout(120)

OPS_APP = "tests.apps.ops_app:queue"
FAST_POLL = ("--poll-interval", "0.1")


def local_queue(backend: Backend) -> sqlqueue.Queue:
    """The ops app's tasks in this process, to enqueue them (and fail some)."""
    queue = backend.queue()
    for name, queue_name in (("mail_job", "mail"), ("report_job", "reports")):
        queue.task(name, queue=queue_name)(lambda n: None)

    @queue.task("doomed", queue="dead-letters", max_attempts=1)
    def doomed(n: int) -> None:
        raise ConnectionError("partner down")

    return queue


def _logged(worker: WorkerProcess, text: str) -> bool:
    return text in worker.log()


def statuses(queue: sqlqueue.Queue, ids: list[int]) -> set[str]:
    return {job.status.value for job in queue.jobs(job_ids=ids, limit=len(ids))}


def test_a_paused_queue_stops_every_worker_process_and_resume_restarts_them(
    backend: Backend, workers: Workers
) -> None:
    queue = local_queue(backend)
    started = [workers.start(*FAST_POLL, app=OPS_APP) for _ in range(2)]
    for worker in started:
        worker.wait_ready()

    queue.pause("reports", by="ops", reason="warehouse migration")
    for worker in started:  # each process re-read the pauses (within its poll interval)
        wait_until(
            partial(_logged, worker, "paused by an operator"),
            timeout=10,
            what="the pause to reach the worker",
            explain=worker.describe,
        )
    reports = enqueue(queue, "report_job", 20)
    mail = enqueue(queue, "mail_job", 20)

    wait_until(
        lambda: statuses(queue, mail) == {"succeeded"}, timeout=20, what="the mail jobs to run"
    )
    # The reports were enqueued first, so every claim round that took a mail job would have
    # taken reports before it, had a worker ignored the pause: none did.
    assert statuses(queue, reports) == {"queued"}
    assert queue.stats().queues["reports"].paused

    assert queue.resume("reports")
    wait_until(
        lambda: statuses(queue, reports) == {"succeeded"},
        timeout=20,
        what="the report jobs to run after resume",
    )
    for worker in started:
        assert worker.stop() == 0, worker.describe()


def test_two_workers_with_retention_prune_old_jobs_once_between_them(
    backend: Backend, tmp_path: Path
) -> None:
    queue = local_queue(backend)
    old = enqueue(queue, "mail_job", 1200)
    drain(queue, concurrency=50)
    recent = enqueue(queue, "mail_job", 10)
    drain(queue)
    waiting = enqueue(queue, "report_job", 5)  # queued jobs are never pruned
    age_jobs(queue, old + waiting, by=timedelta(days=2))

    env = child_env(backend.url, OPS_RETENTION_SUCCEEDED="3600", OPS_RETENTION_BATCH="100")
    started = [
        WorkerProcess(
            [OPS_APP, "--queues", "mail", *FAST_POLL], env, tmp_path / f"retention-{index}.log"
        )
        for index in range(2)
    ]
    try:
        for worker in started:  # both serving (a SIGTERM before start-up kills, not stops)
            worker.wait_ready()
        wait_until(
            lambda: count_jobs(backend.engine, status="succeeded") == len(recent),
            timeout=60,
            what="retention to prune the old jobs",
            explain=lambda: "\n".join(worker.describe() for worker in started),
        )
        for worker in started:
            assert worker.stop() == 0, worker.describe()
        logs = [worker.log() for worker in started]
    finally:
        for worker in started:
            worker.close()

    pruned = [int(n) for log in logs for n in re.findall(r"retention: pruned (\d+) succeeded", log)]
    assert sum(pruned) == len(old), logs  # no row counted twice, none missed
    assert not any("Traceback" in log or "retention failed" in log for log in logs), logs
    assert {job.id for job in queue.jobs(limit=100)} == set(recent + waiting)


def test_two_processes_requeueing_the_same_dead_jobs_make_one_new_job_each(
    backend: Backend, tmp_path: Path
) -> None:
    queue = local_queue(backend)
    dead = enqueue(queue, "doomed", 300)
    drain(queue, concurrency=50)
    assert statuses(queue, dead) == {"dead"}

    start = tmp_path / "start"
    racers = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.apps.requeuer", str(start)],
            cwd=REPO_ROOT,
            env=child_env(backend.url),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    wait_until(  # both have imported sqlqueue and wait on the start file
        lambda: len(list(tmp_path.glob("start.ready.*"))) == len(racers),
        timeout=60,
        what="both racers to be ready",
    )
    start.touch()
    outputs = [racer.communicate(timeout=60) for racer in racers]

    assert all(racer.returncode == 0 for racer in racers), outputs
    counts = [int(out.strip()) for out, _ in outputs]
    assert sum(counts) == len(dead), counts
    requeued_as = [queue.get_job(job_id).requeued_as for job_id in dead]  # type: ignore[union-attr]
    assert None not in requeued_as
    assert len(set(requeued_as)) == len(dead)
    assert count_jobs(backend.engine, status="queued") == len(dead)
