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
from tests._support.statements import statements
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


# -- the row rides on the heartbeat; retention prunes the rows of gone workers -----------------


def test_the_heartbeat_writes_the_row_in_the_transaction_that_extends_the_leases(
    backend: Backend,
) -> None:
    from sqlqueue._worker.heartbeat import Heartbeat
    from sqlqueue._worker.registry import Registration

    queue = _queue(backend)
    with backend.engine.begin() as conn:
        queue.enqueue(conn, "mail_job", {"n": 1})
    [job] = queue.store.claim(
        queues=["mail"], job_types=None, limit=1, worker_id="w1", lease_seconds=30
    )
    registration = Registration(
        queue.admin, worker_id="w1", queues={"mail": 2}, job_types=None, interval=10.0
    )
    heartbeat = Heartbeat(queue.store, registration=registration, lease_seconds=30)
    with statements(backend.engine) as alone:  # the row's upsert in a transaction of its own
        registration.announce(running=0, stopping=False)
    with statements(backend.engine) as sent:
        beat = heartbeat.run_once([job], still_running=lambda _: True, running=1, stopping=False)
    assert beat.lost == frozenset()
    assert (alone.commits, sent.commits) == (1, 1)  # the row and the leases: one transaction
    # The row costs the heartbeat what its upsert costs alone (one statement; MariaDB's
    # emulated upsert a few), and gone workers' rows are no longer deleted on the way.
    assert len(sent.touching("sqlqueue_workers")) == len(alone.touching("sqlqueue_workers"))
    assert not [sql for sql in sent.sql if sql.lstrip().upper().startswith("DELETE")]
    assert len(sent.touching("lease_expires_at")) == 1  # the leases' update
    (info,) = queue.workers()
    assert (info.id, info.queues, info.running, info.alive) == ("w1", {"mail": 2}, 1, True)


def test_retention_prunes_the_rows_of_workers_gone_long_enough(backend: Backend) -> None:
    retention = sqlqueue.Retention(gone_workers=3600.0, interval=0.05)
    queue = _queue(backend, retention=retention)
    _announce(queue, "live", {"mail": 1})
    _announce(queue, "killed_long_ago", {"mail": 1})
    _last_seen(backend, "killed_long_ago", 7200)
    _announce(queue, "killed_lately", {"mail": 1})
    _last_seen(backend, "killed_lately", 60)
    worker = queue.worker(queues=["reports"], poll_interval=0.05)
    with WorkerThread(worker):
        wait_until(
            lambda: "killed_long_ago" not in {w.id for w in queue.workers(include_gone=True)},
            what="retention to prune the row of the worker gone two hours ago",
        )
        kept = {w.id: w.alive for w in queue.workers(include_gone=True)}
        assert kept == {"live": True, "killed_lately": False, worker.worker_id: True}


def test_gone_workers_rows_are_kept_a_day_by_default(backend: Backend) -> None:
    # A retention that prunes no jobs (every age None, as a queue without one: sqlqueue uses
    # Retention() then, every minute) still prunes gone workers' rows, a day after they left.
    queue = _queue(backend, retention=sqlqueue.Retention(interval=0.05))
    _announce(queue, "killed_two_days_ago", {"mail": 1})
    _last_seen(backend, "killed_two_days_ago", 2 * 86400)
    _announce(queue, "killed_an_hour_ago", {"mail": 1})
    _last_seen(backend, "killed_an_hour_ago", 3600)
    worker = queue.worker(queues=["reports"], poll_interval=0.05)
    with WorkerThread(worker):
        wait_until(
            lambda: "killed_two_days_ago" not in {w.id for w in queue.workers(include_gone=True)},
            what="the default retention to prune the row of the worker gone two days ago",
        )
        assert "killed_an_hour_ago" in {w.id for w in queue.workers(include_gone=True)}


def test_gone_workers_retention_must_not_be_negative() -> None:
    with pytest.raises(sqlqueue.ConfigurationError, match=r"Retention\.gone_workers must be >= 0"):
        sqlqueue.Retention(gone_workers=-1.0)
    assert sqlqueue.Retention().gone_workers == 86400.0
    assert sqlqueue.Retention(gone_workers=None).gone_workers is None
