"""Flask with Flask-SQLAlchemy, through Flask's test client and its real ``flask`` command:
``db.session`` enqueues in the request's transaction, and ``flask sqlqueue worker|migrate|
stats|health`` are the sqlqueue commands on the app's Queue."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import flask
import pytest
import sqlalchemy as sa

import sqlqueue
import sqlqueue.flask
from tests._support import REPO_ROOT
from tests.conftest import Backend
from tests.frameworks.flask_app import create_app
from tests.frameworks.welcome import metadata, welcomes

APP = "tests.frameworks.flask_app"


@pytest.fixture
def app(backend: Backend):
    metadata.create_all(backend.engine)
    made = create_app(backend.url)
    made.testing = True
    return made


def flask_command(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``flask --app tests.frameworks.flask_app ARGS`` on the database ``url``, as a user runs
    it."""
    env = {"FLASK_TEST_DATABASE_URL": url, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, "-m", "flask", "--app", APP, *args],
        cwd=REPO_ROOT,
        env={**_clean_environment(), **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _clean_environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("SQLQUEUE_", "FLASK_"))}


def _count(engine: sa.Engine, table: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text(f"SELECT COUNT(*) FROM {table}")).scalar_one())


def test_a_request_that_aborts_after_enqueueing_leaves_no_job(backend, app):
    response = app.test_client().post("/signups", data={"email": "a@example.com", "fail": "1"})
    assert response.status_code == 409
    assert _count(backend.engine, "sqlqueue_jobs") == 0
    assert _count(backend.engine, "fw_users") == 0


def test_a_committed_request_s_job_is_run_by_flask_sqlqueue_worker(backend, app):
    response = app.test_client().post("/signups", data={"email": "b@example.com"})
    assert response.status_code == 201
    placed = response.get_json()
    queue = app.extensions["sqlqueue"]
    assert queue.get_job(placed["job"]).status == sqlqueue.JobStatus.QUEUED

    worker = flask_command(backend.url, "sqlqueue", "worker", "--burst", "--concurrency", "2")
    assert worker.returncode == 0, worker.stderr
    assert queue.get_job(placed["job"]).status == sqlqueue.JobStatus.SUCCEEDED
    with backend.engine.connect() as conn:
        assert conn.execute(sa.select(welcomes.c.user_id)).scalars().all() == [placed["user"]]


def test_flask_sqlqueue_migrate_stats_and_health_are_the_sqlqueue_commands(backend, app):
    migrated = flask_command(backend.url, "sqlqueue", "migrate")
    assert migrated.returncode == 0, migrated.stderr
    assert migrated.stdout.startswith("sqlqueue: already up to date at revision")

    app.test_client().post("/signups", data={"email": "c@example.com"})
    stats = flask_command(backend.url, "sqlqueue", "stats", "--json")
    assert stats.returncode == 0, stats.stderr
    assert json.loads(stats.stdout)["by_status"]["queued"] == 1

    health = flask_command(backend.url, "sqlqueue", "health")
    assert health.returncode in (0, 1), health.stderr  # 1: an alarm (no worker is running)

    bad = flask_command(backend.url, "sqlqueue", "worker", "--queues", "a=x")
    assert bad.returncode == 2
    assert "--queues: expected name=slots" in bad.stderr


def test_flask_sqlqueue_worker_help_is_sqlqueue_worker_s(tmp_path):
    shown = flask_command(f"sqlite:///{tmp_path / 'app.db'}", "sqlqueue", "worker", "--help")
    assert shown.returncode == 0
    assert "--concurrency" in shown.stdout
    assert "usage: flask sqlqueue worker" in shown.stdout


def test_init_app_refuses_something_that_is_not_a_queue():
    with pytest.raises(sqlqueue.ConfigurationError, match=r"expected a sqlqueue\.Queue"):
        sqlqueue.flask.init_app(flask.Flask(__name__), "sqlite:///jobs.db")  # type: ignore[arg-type]
