"""Worker processes of different apps on one queue (issue 30, item 1): each claims only the job
types it has a task for, so every job runs exactly once on the app that knows it and none dies;
in a rolling deploy an old release leaves a new type queued for the new release.

Workers are ``python -m sqlqueue worker tests.apps.typed_apps:…`` children; what ran where is
read from the ledger rows their handlers write (``tests/apps/typed_apps.py``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from datetime import timedelta

import pytest
import sqlalchemy as sa

import sqlqueue
from sqlqueue._schema import jobs
from tests._support import db_now
from tests.apps.ledger import create_ledger, read_ledger
from tests.apps.processes import REPO_ROOT, Workers, child_env, wait_until
from tests.conftest import Backend

pytestmark = pytest.mark.timeout(180)

FAST_POLL = ("--poll-interval", "0.05")
APPS = "tests.apps.typed_apps"


@pytest.fixture
def producer(backend: Backend) -> sqlqueue.Queue:
    """The enqueuing side: it knows every type (its own worker is never started)."""
    create_ledger(backend.engine)
    queue = backend.queue()
    for job_type in ("typed.a", "typed.b"):
        queue.task(job_type)(lambda: None)
    return queue


def enqueue(queue: sqlqueue.Queue, job_types: list[str]) -> dict[int, str]:
    """Enqueue one job per entry, in one transaction: ``{id: type}``."""
    with queue.engine.begin() as conn:
        return {queue.enqueue(conn, job_type): job_type for job_type in job_types}


def statuses(engine: sa.Engine) -> dict[int, tuple[str, int]]:
    """Each job's status and attempts."""
    with engine.connect() as conn:
        rows = conn.execute(sa.select(jobs.c.id, jobs.c.status, jobs.c.attempts))
        return {row.id: (row.status, row.attempts) for row in rows}


def sqlqueue_cli(backend: Backend, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sqlqueue", *args],
        cwd=REPO_ROOT,
        env=child_env(backend.url),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_two_apps_on_one_queue_each_run_only_their_own_jobs(
    backend: Backend, producer: sqlqueue.Queue, workers: Workers
) -> None:
    worker_a = workers.start(*FAST_POLL, "--concurrency", "4", app=f"{APPS}:app_a")
    worker_b = workers.start(*FAST_POLL, "--concurrency", "4", app=f"{APPS}:app_b")
    worker_a.wait_ready()
    worker_b.wait_ready()
    wanted = enqueue(producer, ["typed.a", "typed.b"] * 150)

    def all_done() -> bool:
        return all(status == "succeeded" for status, _ in statuses(backend.engine).values())

    wait_until(all_done, timeout=90, what="every job to succeed", explain=worker_b.describe)
    assert worker_a.stop() == 0
    assert worker_b.stop() == 0
    ran = read_ledger(backend.engine)
    assert Counter(row.job_id for row in ran) == Counter(list(wanted))  # each exactly once
    app_of = {worker_a.pid: "typed.a", worker_b.pid: "typed.b"}
    assert {row.job_id: app_of[row.pid] for row in ran} == wanted  # on the app that knows it
    # Never claimed by the other app: one attempt each, none dead.
    assert set(statuses(backend.engine).values()) == {("succeeded", 1)}


def test_a_rolling_deploy_old_release_leaves_the_new_type_to_the_new_release(
    backend: Backend, producer: sqlqueue.Queue, workers: Workers
) -> None:
    old = workers.start(*FAST_POLL, app=f"{APPS}:old_release")
    old.wait_ready()
    wanted = enqueue(producer, ["typed.a", "typed.b"] * 20)
    new_ids = [job_id for job_id, job_type in wanted.items() if job_type == "typed.b"]

    def old_type_done() -> bool:
        now = statuses(backend.engine)
        return all(now[job_id][0] == "succeeded" for job_id in wanted if job_id not in new_ids)

    wait_until(old_type_done, timeout=60, what="the old release's jobs", explain=old.describe)
    # The old release has gone round its claim loop many times since (poll 0.05 s): the new
    # type is still queued, with no attempt used.
    assert {statuses(backend.engine)[job_id] for job_id in new_ids} == {("queued", 0)}

    # Health names the type the live worker does not know, in one line, and exits 1.
    due = db_now(backend.engine) - timedelta(seconds=600)
    with backend.engine.begin() as conn:
        conn.execute(sa.update(jobs).where(jobs.c.id.in_(new_ids)).values(next_run_at=due))
    health = sqlqueue_cli(backend, "health", "--max-queued-age", "5m")
    assert health.returncode == 1, health.stderr
    (line,) = [line for line in health.stdout.splitlines() if "unknown_type" in line]
    assert "queue 'default': no live worker has a task for 'typed.b' (20 due jobs, oldest 6" in line
    assert "queued_age" not in health.stdout
    alarms = json.loads(sqlqueue_cli(backend, "health", "--json").stdout)["alarms"]
    assert [(alarm["name"], alarm["job_types"]) for alarm in alarms] == [
        ("unknown_type", ["typed.b"])
    ]

    new = workers.start(*FAST_POLL, app=f"{APPS}:new_release")
    new.wait_ready()

    def new_type_done() -> bool:
        now = statuses(backend.engine)
        return all(now[job_id][0] == "succeeded" for job_id in new_ids)

    wait_until(new_type_done, timeout=60, what="the new type's jobs", explain=new.describe)
    assert old.stop() == 0
    assert new.stop() == 0
    ran = read_ledger(backend.engine)
    assert Counter(row.job_id for row in ran) == Counter(list(wanted))
    assert {row.pid for row in ran if row.job_id in new_ids} == {new.pid}
    assert set(statuses(backend.engine).values()) == {("succeeded", 1)}
    assert sqlqueue_cli(backend, "health").returncode == 0


def test_a_burst_worker_exits_when_only_jobs_it_cannot_run_are_due(
    backend: Backend, producer: sqlqueue.Queue, workers: Workers
) -> None:
    (stray,) = enqueue(producer, ["typed.b"])
    burst = workers.start(*FAST_POLL, "--burst", app=f"{APPS}:app_a")
    assert burst.wait(timeout=60) == 0
    assert statuses(backend.engine)[stray] == ("queued", 0)


def test_a_worker_on_a_module_with_no_task_refuses_to_start_in_one_line(
    backend: Backend,
) -> None:
    result = sqlqueue_cli(backend, "worker", f"{APPS}:forgot_tasks", "--burst")
    assert result.returncode == 2
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"sqlqueue: error: {APPS}:forgot_tasks has no task: module '{APPS}' (")
    assert "typed_apps.py) registered none" in line
    assert "import the modules that declare your tasks" in line
