"""FastAPI, through its TestClient: a request's ``AsyncSession`` enqueues in the request's
transaction, a worker process runs what committed, and ``sqlqueue.asgi.lifespan`` runs a worker
in the app's process and stops it gracefully on shutdown."""

from __future__ import annotations

import threading

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

import sqlqueue
import sqlqueue.asgi
from tests._support import wait_until
from tests.conftest import Backend
from tests.frameworks import welcome
from tests.frameworks.fastapi_app import create_app
from tests.frameworks.welcome import metadata, register_tasks

WELCOME_APP = "tests.frameworks.welcome:queue"


@pytest.fixture
def queue(backend: Backend):
    metadata.create_all(backend.engine)
    made = backend.queue()
    register_tasks(made)
    return made


def _count(engine: sa.Engine, sql: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text(sql)).scalar_one())


def test_a_request_that_raises_after_enqueueing_leaves_no_job(backend, queue):
    with TestClient(create_app(queue)) as client:
        response = client.post("/signups", params={"email": "a@example.com", "fail": True})
    assert response.status_code == 409
    assert _count(backend.engine, "SELECT COUNT(*) FROM sqlqueue_jobs") == 0
    assert _count(backend.engine, "SELECT COUNT(*) FROM fw_users") == 0


def test_a_committed_request_s_job_is_run_by_a_worker_process(backend, queue, workers):
    with TestClient(create_app(queue)) as client:
        response = client.post("/signups", params={"email": "b@example.com"})
    assert response.status_code == 201
    placed = response.json()
    assert queue.get_job(placed["job"]).status == sqlqueue.JobStatus.QUEUED

    worker = workers.start("--burst", app=WELCOME_APP)
    assert worker.wait(120) == 0, worker.describe()
    assert queue.get_job(placed["job"]).status == sqlqueue.JobStatus.SUCCEEDED
    with backend.engine.connect() as conn:
        ran = conn.execute(sa.select(welcome.welcomes.c.user_id)).scalars().all()
    assert ran == [placed["user"]]


def test_the_lifespan_runs_jobs_in_the_app_and_lets_them_finish_on_shutdown(backend, queue):
    welcome.started.clear()
    app = create_app(
        queue, lifespan=sqlqueue.asgi.lifespan(queue, queues=["default"], concurrency=2)
    )
    client = TestClient(app)
    client.__enter__()
    try:
        signed_up = client.post("/signups", params={"email": "c@example.com"}).json()
        wait_until(
            lambda: queue.get_job(signed_up["job"]).status == sqlqueue.JobStatus.SUCCEEDED,
            30,
            what="the app's worker to run the welcome job",
        )
        held = client.post("/holds").json()
        wait_until(welcome.started.is_set, 30, what="the hold job to start")
    finally:
        # Shutdown: the worker stops claiming and tells the running job (ctx.cancelled),
        # which then finishes; the lifespan waits for it.
        stopping = threading.Thread(target=client.__exit__, args=(None, None, None))
        stopping.start()
        stopping.join(60)
    assert not stopping.is_alive()
    job = queue.get_job(held["job"])
    assert job.status == sqlqueue.JobStatus.SUCCEEDED
    assert job.attempts == 1


def test_the_lifespan_refuses_a_queue_without_tasks_at_start_up(backend):
    empty = backend.queue()
    app = create_app_without_routes(sqlqueue.asgi.lifespan(empty))
    with pytest.raises(sqlqueue.ConfigurationError, match="no task is registered"):  # noqa: SIM117
        with TestClient(app):
            pass


def test_the_lifespan_names_an_unknown_worker_option(backend, queue):
    with pytest.raises(sqlqueue.ConfigurationError, match="unknown worker option: bogus"):
        sqlqueue.asgi.lifespan(queue, bogus=1)


def create_app_without_routes(lifespan):
    from fastapi import FastAPI

    return FastAPI(lifespan=lifespan)
