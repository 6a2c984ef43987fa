"""A ``manage.py sqlqueue_worker`` process looks after Django's connections around each
handler, as Django's request cycle does (``close_old_connections`` before and after): the
server drops the handler's connection between two jobs, and the second job still succeeds at
its first attempt, on a connection of its own."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
import sqlalchemy as sa

import sqlqueue
from tests._support import wait_until
from tests.conftest import Backend
from tests.frameworks.django_support import PROJECT, prepare, project_env, rows

#: One handler thread, so both jobs run on the same thread (and its Django connection).
ONE_AT_A_TIME = ("--concurrency", "1", "--poll-interval", "0.1")


def _run(backend: Backend, label: str) -> sqlqueue.Job:
    """Enqueue ``note_session`` for ``label`` and wait until the worker is done with it."""
    queue = backend.queue()
    with backend.engine.begin() as conn:
        job_id = queue.enqueue(conn, "note_session", {"label": label}, external=True)

    def finished() -> sqlqueue.Job | None:
        job = queue.get_job(job_id)
        assert job is not None
        return None if job.status in ("queued", "running") else job

    return wait_until(finished, 60, what=f"the worker to run {label!r}")


def _drop_session(backend: Backend, session: int) -> bool:
    """End server session ``session`` as a restart or an idle timeout would, and wait until
    it is gone; whether it was there to end."""
    admin = sa.create_engine(backend.url, poolclass=sa.pool.NullPool)
    postgres = backend.name == "postgresql"
    sessions = (
        "pg_stat_activity WHERE pid" if postgres else "information_schema.processlist WHERE id"
    )
    count = sa.text(f"SELECT count(*) FROM {sessions} = :id")

    def there() -> bool:
        with admin.connect() as conn:  # a new snapshot each time
            return int(conn.execute(count, {"id": session}).scalar_one()) == 1

    try:
        alive = there()
        if alive:
            try:
                with admin.connect() as conn:
                    if postgres:
                        conn.execute(sa.text("SELECT pg_terminate_backend(:id)"), {"id": session})
                    else:
                        conn.exec_driver_sql(f"KILL {int(session)}")
            except sa.exc.OperationalError:  # it ended by itself in the meantime
                alive = there()
        wait_until(lambda: not there(), what=f"session {session} to end")
        return alive
    finally:
        admin.dispose()


@pytest.mark.parametrize("persistent", [False, True], ids=["per-job", "persistent"])
def test_a_handlers_connection_dropped_between_two_jobs_is_replaced(
    backend: Backend, persistent: bool
):
    """Per job (``CONN_MAX_AGE = 0``, Django's default) the connection is closed after each
    job; persistent (``CONN_MAX_AGE = None`` with ``CONN_HEALTH_CHECKS``) it is still open when
    the server drops it, and checked before the next job uses it."""
    backend.requires("many_hosts")  # a server whose sessions can be ended from outside
    prepare(backend.url)
    env = project_env(backend.url)
    env["SHOP_PERSISTENT_CONNECTIONS"] = "1" if persistent else "0"
    worker = subprocess.Popen(
        [sys.executable, "manage.py", "sqlqueue_worker", "shop.jobs:queue", *ONE_AT_A_TIME],
        cwd=PROJECT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        first = _run(backend, "first")
        assert first.status == "succeeded", first
        ((session,),) = rows(backend.engine, "SELECT session FROM shop_session")
        alive = _drop_session(backend, session)
        # Persistent, the handler thread's connection is still open: the server ends it.
        assert alive or not persistent

        second = _run(backend, "second")
        assert (second.status, second.attempts) == ("succeeded", 1), second.errors
        sessions = rows(backend.engine, "SELECT label, session FROM shop_session ORDER BY id")
        assert [label for label, _ in sessions] == ["first", "second"]
        assert sessions[1][1] != session
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.communicate()
