"""Periodic jobs: each cron slot is enqueued exactly once, however many schedulers run."""

from __future__ import annotations

import itertools
import threading
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

import sqlqueue
from sqlqueue._policies.periodic import Periodic
from sqlqueue._schema import jobs
from sqlqueue._worker.scheduler import Scheduler
from tests._support import WorkerThread, count_jobs, wait_until


def _nightly(backend, **options):
    queue = backend.queue()

    @queue.periodic("0 3 * * *", "nightly_report", payload={"kind": "daily"}, **options)
    def nightly_report(kind: str) -> None:
        pass

    return queue


def test_each_slot_is_enqueued_once_by_many_schedulers(backend):
    queue = _nightly(backend)
    now = datetime(2026, 11, 29, 3, 0, 5, tzinfo=UTC)
    schedulers = [Scheduler(queue, queue.periodic_schedules) for _ in range(5)]
    ids = {job_id for scheduler in schedulers for job_id in scheduler.run_once(now=now)}
    assert len(ids) == 1
    job = queue.get_job(ids.pop())
    assert job.idempotency_key == "periodic:nightly_report:2026-11-29T03:00:00+00:00"
    assert job.next_run_at == datetime(2026, 11, 29, 3, 0, tzinfo=UTC)
    assert job.payload == {"kind": "daily"}
    # Later the same day: still the same slot, nothing new; the next night: one more.
    for scheduler in schedulers:
        scheduler.run_once(now=now + timedelta(hours=12))
    assert count_jobs(backend.engine) == 1
    for scheduler in schedulers:
        scheduler.run_once(now=now + timedelta(days=1))
    assert count_jobs(backend.engine) == 2


def test_after_downtime_only_the_latest_missed_slot_runs(backend):
    queue = _nightly(backend)
    Scheduler(queue, queue.periodic_schedules).run_once(
        now=datetime(2026, 11, 20, 3, 0, 1, tzinfo=UTC)
    )
    # Every worker was down for a week.
    fresh = Scheduler(queue, queue.periodic_schedules)
    [job_id] = fresh.run_once(now=datetime(2026, 11, 27, 14, 0, tzinfo=UTC))
    assert queue.get_job(job_id).next_run_at == datetime(2026, 11, 27, 3, 0, tzinfo=UTC)
    assert count_jobs(backend.engine) == 2


def test_skip_policy_drops_slots_older_than_the_grace(backend):
    queue = _nightly(backend, missed="skip", grace_seconds=120)
    scheduler = Scheduler(queue, queue.periodic_schedules)
    assert scheduler.run_once(now=datetime(2026, 11, 27, 14, 0, tzinfo=UTC)) == []
    assert len(scheduler.run_once(now=datetime(2026, 11, 28, 3, 1, tzinfo=UTC))) == 1


def test_schedules_follow_their_time_zone(backend):
    queue = _nightly(backend, timezone="Europe/Moscow")
    [job_id] = Scheduler(queue, queue.periodic_schedules).run_once(
        now=datetime(2026, 11, 29, 1, 0, tzinfo=UTC)
    )
    assert queue.get_job(job_id).next_run_at == datetime(2026, 11, 29, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"cron": "61 * * * *"}, "cron"),
        ({"cron": "* * * * *", "timezone": "Mars/Olympus"}, "timezone"),
        ({"cron": "* * * * *", "missed": "all"}, "missed"),
        ({"cron": "* * * * *", "grace_seconds": 0}, "grace_seconds"),
        ({"cron": "* * * * *", "payload": {"at": datetime(2026, 1, 1)}}, "datetime"),
    ],
)
def test_bad_schedules_are_refused_at_declaration(options, field):
    with pytest.raises(sqlqueue.SqlqueueError, match=field):
        Periodic(task="t", **options)


def test_worker_processes_enqueue_every_second_slot_exactly_once(backend, tmp_path):
    """Three worker processes run their schedulers against one every-second schedule."""
    from tests.apps.processes import Workers

    workers = Workers(backend.url, tmp_path)
    try:
        started = [
            workers.start("--poll-interval", "0.1", app="tests.apps.periodic_app:queue")
            for _ in range(3)
        ]
        for worker in started:
            worker.wait_ready()
        # Three schedulers race for each slot: wait until four slots have been enqueued.
        wait_until(
            lambda: count_jobs(backend.engine, job_type="tick") >= 4,
            timeout=60,
            what="four every-second slots",
            explain=lambda: "\n".join(worker.describe() for worker in started),
        )
        for worker in started:
            assert worker.stop() == 0
            assert "Traceback" not in worker.log(), worker.describe()
    finally:
        workers.close()
    with backend.engine.connect() as conn:
        # Through the column's type: MariaDB/MySQL store the key's UTF-8 bytes.
        keys = (
            conn.execute(sa.select(jobs.c.idempotency_key).where(jobs.c.job_type == "tick"))
            .scalars()
            .all()
        )
    slots = sorted(datetime.fromisoformat(key.removeprefix("periodic:tick:")) for key in keys)
    assert len(slots) >= 3
    # Every second between the first and the last slot has exactly one job: none missed,
    # none twice (three schedulers raced for each).
    gaps = [later - earlier for earlier, later in itertools.pairwise(slots)]
    assert gaps == [timedelta(seconds=1)] * (len(slots) - 1)


def test_a_worker_runs_its_periodic_jobs(backend):
    queue = backend.queue()
    ran = threading.Event()

    @queue.periodic("* * * * * *", "every_second")
    def every_second() -> None:
        ran.set()

    with WorkerThread(queue.worker(poll_interval=0.05)):
        assert ran.wait(10)
    wait_until(lambda: count_jobs(backend.engine, status="succeeded") >= 1)


def test_the_cli_worker_can_serve_another_database(tmp_path):
    """``sqlqueue worker app:queue --database-url URL`` runs the app's tasks on that database."""
    import subprocess
    import sys
    from pathlib import Path

    url = f"sqlite:///{tmp_path / 'other.db'}"
    sqlqueue.migrate(url)
    queue = sqlqueue.Queue(url)
    queue.task("tick")(lambda: None)
    job_id = queue.enqueue(queue.engine, "tick", {})
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "sqlqueue",
            "worker",
            "tests.apps.periodic_app:queue",
            "--database-url",
            url,
            "--burst",
            "--poll-interval",
            "0.05",
        ],
        cwd=Path(__file__).resolve().parent.parent,
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr.decode()
    job = queue.get_job(job_id)
    assert job is not None
    assert job.status == "succeeded"
