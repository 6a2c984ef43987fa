"""The live workers' table as operators read it (issue 25): ``queue.workers()`` and its
``WorkerInfo``, ``sqlqueue workers``, and the ``no_workers`` health alarm, counted from times the
database holds (a job's due time, a worker's last heartbeat) so each case is exact."""

from __future__ import annotations

import json
import threading
from datetime import timedelta

import pytest
import sqlalchemy as sa

import sqlqueue
from sqlqueue._schema import workers
from sqlqueue.testing import age_jobs
from tests._support import WorkerThread, db_now, drain, run_cli, wait_until
from tests.conftest import Backend

pytestmark = pytest.mark.timeout(120)

FIELDS = {
    "id",
    "host",
    "pid",
    "version",
    "queues",
    "started_at",
    "last_seen_at",
    "running",
    "stopping",
    "alive",
}


def _queue(backend: Backend, **options: object) -> sqlqueue.Queue:
    queue = backend.queue(**options)
    queue.task("mail_job", queue="mail")(lambda n: None)
    queue.task("report_job", queue="reports")(lambda n: None)
    return queue


def _announce(queue: sqlqueue.Queue, worker_id: str, queues: dict[str, int]) -> None:
    """A worker's row as its upkeep writes it, live for a minute."""
    facts = {"host": "h", "pid": 7, "version": "0", "running": 0, "stopping": False}
    queue.admin.announce_worker(
        worker_id=worker_id,
        facts={**facts, "queues": queues, "job_types": None},
        expires_in=60.0,
    )


def _last_seen(backend: Backend, worker_id: str, seconds_ago: float) -> None:
    """Make ``worker_id`` last seen ``seconds_ago`` (database clock) and gone since."""
    seen = db_now(backend.engine) - timedelta(seconds=seconds_ago)
    with backend.engine.begin() as conn:
        conn.execute(
            sa.update(workers)
            .where(workers.c.id == worker_id)
            .values(last_seen_at=seen, expires_at=seen + timedelta(seconds=1))
        )


def _alarms(queue: sqlqueue.Queue, *, max_unserved: float) -> dict[str, sqlqueue.Alarm]:
    health = queue.health(max_queued_age=3600, max_unserved=max_unserved)
    return {alarm.name: alarm for alarm in health.alarms}


def test_a_worker_lists_itself_while_it_serves_and_removes_itself_when_it_stops(
    backend: Backend,
) -> None:
    queue = _queue(backend, lease_seconds=3.0)
    assert queue.workers() == []
    worker = queue.worker(queues={"mail": 3, "reports": 1}, poll_interval=0.05)
    with WorkerThread(worker):
        (info,) = wait_until(queue.workers, what="the worker's row")
        assert isinstance(info, sqlqueue.WorkerInfo)
        assert info.id == worker.worker_id
        assert dict(info.queues) == {"mail": 3, "reports": 1}
        assert (info.running, info.stopping, info.alive) == (0, False, True)
        assert info.version == sqlqueue.__version__
        assert info.started_at <= info.last_seen_at <= db_now(backend.engine)
        assert set(info.to_dict()) == FIELDS
        with backend.engine.connect() as conn:
            row = conn.execute(sa.select(workers)).one()
        # Gone after three missed heartbeats (the heartbeat interval is a third of the lease).
        assert row.expires_at - row.last_seen_at == timedelta(seconds=3.0)
    assert queue.workers(include_gone=True) == []


def test_a_worker_gone_without_a_word_is_listed_only_with_include_gone(backend: Backend) -> None:
    queue = _queue(backend)
    _announce(queue, "live", {"mail": 1})
    _announce(queue, "killed", {"mail": 1})
    _last_seen(backend, "killed", 30)
    assert [info.id for info in queue.workers()] == ["live"]
    every = {info.id: info for info in queue.workers(include_gone=True)}
    assert list(every) == ["live", "killed"]  # the live ones first
    assert (every["live"].alive, every["killed"].alive) == (True, False)


def test_the_workers_command_prints_a_table_and_json(backend: Backend) -> None:
    queue = _queue(backend)
    assert run_cli("workers", url=backend.url).stdout.strip() == "no live worker"
    _announce(queue, "w-1", {"mail": 2, "reports": 1})
    _announce(queue, "w-gone", {"mail": 1})
    _last_seen(backend, "w-gone", 30)

    text = run_cli("workers", url=backend.url)
    assert text.returncode == 0, text.stderr
    header, line = text.stdout.splitlines()
    assert header.split()[:4] == ["host", "pid", "queues", "running"]
    assert "mail=2, reports=1" in line
    assert "alive" in line
    assert "w-1" in line

    listed = json.loads(run_cli("workers", "--json", url=backend.url).stdout)
    assert [entry["id"] for entry in listed] == ["w-1"]
    (entry,) = listed
    assert set(entry) == FIELDS
    assert (entry["queues"], entry["pid"], entry["alive"]) == ({"mail": 2, "reports": 1}, 7, True)
    every = json.loads(run_cli("workers", "--all", "--json", url=backend.url).stdout)
    assert [(e["id"], e["alive"]) for e in every] == [("w-1", True), ("w-gone", False)]


def test_no_workers_fires_for_a_queue_nobody_serves_and_clears_when_one_does(
    backend: Backend,
) -> None:
    queue = _queue(backend)
    with backend.engine.begin() as conn:
        job_id = queue.enqueue(conn, "mail_job", {"n": 1})
    age_jobs(queue, [job_id], by=timedelta(minutes=10))

    alarm = _alarms(queue, max_unserved=300)["no_workers"]
    assert (alarm.queue, alarm.threshold) == ("mail", 300)
    assert 590 < alarm.figure < 700
    assert "no live worker serves it" in alarm.message
    assert "oldest job is due" in alarm.message
    assert "no_workers" not in _alarms(queue, max_unserved=900)

    _announce(queue, "reports-only", {"reports": 1})  # serves another queue: no help
    assert "no_workers" in _alarms(queue, max_unserved=300)
    _announce(queue, "mail-worker", {"mail": 1})
    assert "no_workers" not in _alarms(queue, max_unserved=300)

    # It died two minutes ago: the queue has been unserved since it was last seen.
    _last_seen(backend, "mail-worker", 120)
    assert "no_workers" not in _alarms(queue, max_unserved=300)
    alarm = _alarms(queue, max_unserved=60)["no_workers"]
    assert 115 < alarm.figure < 200
    assert "last seen" in alarm.message

    queue.pause("mail", by="ops", reason="maintenance")  # waiting on purpose
    assert "no_workers" not in _alarms(queue, max_unserved=60)
    queue.resume("mail")
    drain(queue)  # nothing due: nothing unserved
    assert _alarms(queue, max_unserved=0) == {}


def test_health_cli_takes_max_unserved(backend: Backend) -> None:
    queue = _queue(backend)
    with backend.engine.begin() as conn:
        job_id = queue.enqueue(conn, "report_job", {"n": 1})
    age_jobs(queue, [job_id], by=timedelta(minutes=10))
    sick = run_cli(
        "health", "--max-queued-age", "1h", "--max-unserved", "5m", "--json", url=backend.url
    )
    assert sick.returncode == 1, sick.stderr
    (alarm,) = json.loads(sick.stdout)["alarms"]
    assert (alarm["name"], alarm["queue"], alarm["threshold"]) == ("no_workers", "reports", 300)
    fine = run_cli("health", "--max-queued-age", "1h", "--max-unserved", "20m", url=backend.url)
    assert (fine.returncode, fine.stdout.strip()) == (0, "healthy: no alarm")
    bad = run_cli("health", "--max-unserved", "soon", url=backend.url)
    assert bad.returncode == 2
    assert "--max-unserved" in bad.stderr


def test_health_refuses_a_negative_max_unserved(backend: Backend) -> None:
    with pytest.raises(sqlqueue.ConfigurationError, match="thresholds"):
        backend.queue().health(max_unserved=-1)


def test_a_stopping_worker_says_so_while_its_last_job_finishes(backend: Backend) -> None:
    queue = backend.queue(lease_seconds=30.0)
    release = threading.Event()
    started = threading.Event()

    @queue.task("slow")
    def slow() -> None:
        started.set()
        release.wait(60)

    with backend.engine.begin() as conn:
        queue.enqueue(conn, "slow")
    worker = queue.worker(poll_interval=0.05)
    running = WorkerThread(worker)
    running.thread.start()
    try:
        assert started.wait(30), "the job never started"
        worker.stop()  # no new claims; the running job may finish
        (info,) = wait_until(
            lambda: [w for w in queue.workers() if w.stopping],
            what="the worker's row to say it is stopping",
        )
        assert (info.alive, info.running) == (True, 1)
    finally:
        release.set()
        running.stop()
    assert queue.workers(include_gone=True) == []
