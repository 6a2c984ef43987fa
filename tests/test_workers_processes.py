"""The live workers' table with real worker processes (issue 25): three workers list three;
a SIGKILLed one leaves the live list once its three heartbeat intervals have passed, a
SIGTERMed one at once; ``jobs show`` names the host and pid running a job; and ``no_workers``
fires while nobody serves a queue with due jobs and clears when workers come."""

from __future__ import annotations

import json
import signal
import socket
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

import sqlqueue
from sqlqueue._schema import workers as workers_table
from sqlqueue.testing import age_jobs
from tests._support import run_cli
from tests.apps.processes import Workers, wait_until
from tests.conftest import Backend

pytestmark = pytest.mark.timeout(180)

APP = "tests.apps.workers_app:queue"
LEASE = 1.5  # a heartbeat every 0.5 s: gone after 1.5 s without one
OPTIONS = ("--queues", "mail=2,reports=1", "--poll-interval", "0.1")


def _local(backend: Backend) -> sqlqueue.Queue:
    queue = backend.queue()
    queue.task("quick", queue="mail")(lambda n: None)
    queue.task("hold", queue="reports")(lambda flag: None)
    return queue


def _listed(backend: Backend, *options: str) -> list[dict[str, object]]:
    done = run_cli("workers", "--json", *options, url=backend.url)
    assert done.returncode == 0, done.stderr
    listed: list[dict[str, object]] = json.loads(done.stdout)
    return listed


def _live_pids(queue: sqlqueue.Queue) -> set[int]:
    return {info.pid for info in queue.workers()}


def test_workers_lists_each_process_and_drops_killed_and_stopped_ones(
    backend: Backend, workers: Workers, tmp_path: Path
) -> None:
    queue = _local(backend)
    with backend.engine.begin() as conn:
        waiting = queue.enqueue(conn, "quick", {"n": 1})
    age_jobs(queue, [waiting], by=timedelta(minutes=10))
    sick = run_cli("health", "--max-queued-age", "1h", "--json", url=backend.url)
    assert [a["name"] for a in json.loads(sick.stdout)["alarms"]] == ["no_workers"]

    started = [workers.start(*OPTIONS, app=APP, lease_seconds=LEASE) for _ in range(3)]
    for worker in started:
        worker.wait_ready()
    pids = {worker.pid for worker in started}
    wait_until(lambda: _live_pids(queue) == pids, timeout=30, what="three live workers")
    listed = _listed(backend)
    assert len(listed) == 3
    for entry in listed:
        assert set(entry) == {
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
        assert entry["host"] == socket.gethostname()
        assert entry["queues"] == {"mail": 2, "reports": 1}
        assert (entry["alive"], entry["stopping"], entry["version"]) == (
            True,
            False,
            sqlqueue.__version__,
        )
    # A worker's row expires three heartbeat intervals after its last heartbeat.
    with backend.engine.connect() as conn:
        rows = conn.execute(sa.select(workers_table)).all()
    spans = {row.expires_at - row.last_seen_at for row in rows}
    assert spans == {timedelta(seconds=LEASE)}
    # The workers ran the waiting job: the alarm cleared.
    wait_until(
        lambda: run_cli("health", "--max-queued-age", "1h", url=backend.url).returncode == 0,
        timeout=30,
        what="no_workers to clear",
    )

    # A running job names its worker's host and pid.
    flag = tmp_path / "release"
    with backend.engine.begin() as conn:
        held = queue.enqueue(conn, "hold", {"flag": str(flag)})

    def running() -> sqlqueue.Job | None:
        found = queue.get_job(held)
        return found if found is not None and found.status.value == "running" else None

    job = wait_until(running, timeout=30, what="the held job to run")
    shown = run_cli("jobs", "show", str(held), url=backend.url)
    (line,) = [line for line in shown.stdout.splitlines() if line.startswith("worker:")]
    runner = next(w for w in started if f"pid {w.pid}" in line)
    assert line.split(maxsplit=1)[1] == f"{socket.gethostname()} pid {runner.pid}"
    as_json = json.loads(run_cli("jobs", "show", str(held), "--json", url=backend.url).stdout)
    assert (as_json["worker"]["pid"], as_json["worker"]["id"]) == (runner.pid, job.locked_by)
    wait_until(
        lambda: any(info.pid == runner.pid and info.running == 1 for info in queue.workers()),
        timeout=30,
        what="the worker's row to count the running job",
    )
    flag.touch()
    wait_until(
        lambda: (found := queue.get_job(held)) and found.status.value == "succeeded",
        timeout=30,
        what="the held job to finish",
    )
    done = run_cli("jobs", "show", str(held), url=backend.url).stdout
    assert "worker:" in done  # the line is there, empty: nobody runs it now
    assert f"pid {runner.pid}" not in done

    killed, stopped, kept = started
    killed.send(signal.SIGKILL)
    killed.wait(30)
    wait_until(
        lambda: _live_pids(queue) == {stopped.pid, kept.pid},
        timeout=30,
        what="the killed worker to leave the live list",
    )
    (gone,) = [e for e in _listed(backend, "--all") if e["pid"] == killed.pid]
    assert gone["alive"] is False

    assert stopped.stop() == 0
    # A clean exit deletes the row: gone at once, not even listed with --all.
    assert stopped.pid not in {entry["pid"] for entry in _listed(backend, "--all")}
    assert _live_pids(queue) == {kept.pid}
    text = run_cli("workers", url=backend.url).stdout
    assert f" {kept.pid} " in text
    assert f" {stopped.pid} " not in text
