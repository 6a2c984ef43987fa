"""sqlqueue.django with Django itself: a real project (tests/frameworks/django_project) on
each backend; jobs enqueued on Django's connection in ``transaction.atomic()`` and run by a
``manage.py sqlqueue_worker`` process whose handler reads a model through the ORM."""

from __future__ import annotations

import sqlite3
import subprocess
import sys

from tests.conftest import Backend
from tests.frameworks.django_support import PROJECT, manage, manage_json, prepare, project_env, rows


def test_a_job_enqueued_in_atomic_is_in_that_transaction_and_runs_in_a_manage_py_worker(
    backend: Backend,
):
    prepare(backend.url)
    placed = manage_json(backend.url, "place_order", "r1", "book")
    # Django's connection saw the job inside its transaction; the queue's own engine did not.
    assert placed["inside"] == 1
    assert placed["outside"] is False
    assert rows(backend.engine, "SELECT id, status FROM sqlqueue_jobs") == [
        (placed["job"], "queued")
    ]

    worker = subprocess.run(
        [sys.executable, "manage.py", "sqlqueue_worker", "shop.jobs:queue", "--burst"],
        cwd=PROJECT,
        env=project_env(backend.url),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert worker.returncode == 0, worker.stderr
    assert rows(backend.engine, "SELECT status FROM sqlqueue_jobs") == [("succeeded",)]
    # The handler read the order through the ORM and wrote its shipment.
    assert rows(backend.engine, "SELECT item FROM shop_shipment") == [("book",)]


def test_a_rolled_back_atomic_block_leaves_no_job_and_no_order(backend: Backend):
    prepare(backend.url)
    placed = manage_json(backend.url, "place_order", "r2", "pen", "--fail")
    assert placed["rolled_back"] is True
    assert placed["inside"] == 1  # it was written, in the transaction that rolled back
    assert rows(backend.engine, "SELECT COUNT(*) FROM sqlqueue_jobs") == [(0,)]
    assert rows(backend.engine, "SELECT COUNT(*) FROM shop_order") == [(0,)]


def test_an_enqueue_outside_atomic_commits_at_once_like_a_save(backend: Backend):
    prepare(backend.url)
    placed = manage_json(backend.url, "place_order", "r3", "cup", "--autocommit")
    assert placed["outside"] is True
    assert rows(backend.engine, "SELECT status FROM sqlqueue_jobs") == [("queued",)]


def test_sqlqueue_migrate_migrates_djangos_database(backend: Backend):
    done = manage(backend.url, "sqlqueue_migrate")
    assert done.stdout.startswith("sqlqueue: already up to date at revision")


def test_sqlqueue_worker_takes_the_arguments_of_sqlqueue_worker(backend: Backend):
    bad = subprocess.run(
        [sys.executable, "manage.py", "sqlqueue_worker", "shop.jobs:queue", "--queues", "a=x"],
        cwd=PROJECT,
        env=project_env(backend.url),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert bad.returncode == 2
    assert "--queues: expected name=slots" in bad.stderr


def test_a_database_without_sqlqueues_tables_is_told_to_run_manage_py_migrate(tmp_path):
    path = tmp_path / "unmigrated.db"
    sqlite3.connect(path).close()  # a database, but none of sqlqueue's tables
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", "from shop.jobs import queue; queue.stats()"],
        cwd=PROJECT,
        env=project_env(f"sqlite:///{path}"),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode != 0
    assert "SchemaNotMigrated" in done.stderr, done.stderr
    assert "run `python manage.py migrate` first" in done.stderr, done.stderr
