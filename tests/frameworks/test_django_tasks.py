"""sqlqueue as the backend of Django's Tasks framework (the ``django-tasks`` backport on this
Django), in the test project with ``TASKS`` set (djproject/settings_tasks.py): tasks written
with the framework's ``@task`` are enqueued in ``atomic()`` blocks by ``manage.py tasks_demo``,
which runs ``manage.py sqlqueue_worker --burst`` and reads each result back; the jobs are then
read here, with sqlqueue's own API, on each backend. What the backport's tests ask of a
backend holds: ``READY`` at enqueue, ``refresh()`` and ``get_result()`` agreeing, a failure's
exception class path and traceback, ``TaskResultDoesNotExist`` for an unknown id, a context's
attempt, coroutine tasks."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from sqlqueue import JobStatus
from tests.conftest import Backend
from tests.frameworks.django_support import PROJECT, project_env, rows

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "django.md"


def tasks_demo(url: str, *worker: str) -> dict[str, Any]:
    """``manage.py tasks_demo`` on the database ``url``, its worker given ``worker``; what it
    printed."""
    env = project_env(url)
    env["DJANGO_SETTINGS_MODULE"] = "djproject.settings_tasks"
    done = subprocess.run(
        [sys.executable, "manage.py", "tasks_demo", *(f"--worker={arg}" for arg in worker)],
        cwd=PROJECT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    seen: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["worker"]["status"] == 0, seen["worker"]["output"]
    return seen


def test_tasks_run_in_the_callers_transaction_and_on_manage_py_sqlqueue_worker(backend: Backend):
    seen = tasks_demo(backend.url)
    queue = backend.queue()
    results = seen["results"]

    def job(name: str) -> Any:
        found = queue.get_job(int(results[name]["id"]))
        assert found is not None, name
        return found

    # In atomic(): the job was in the block's transaction, and went with its rollback.
    assert seen["inside"] == 1
    orders = rows(backend.engine, "SELECT request, item FROM shop_order ORDER BY id")
    assert orders == [("kept", "book"), ("", "lamp")]  # the second placed by the guide's view
    shipping = [j for j in queue.jobs() if j.payload.get("task") == "shop.tasks.ship_order"]
    assert sorted(str(j.id) for j in shipping) == sorted(
        [results["shipped"]["id"], seen["view"]["id"]]
    )
    # The guide's views: the POST enqueued in its atomic() block; the GET read READY, then done.
    assert seen["view"] == {
        "placed": 201,
        "id": seen["view"]["id"],
        "before": "READY",
        "after": "SUCCESSFUL",
    }
    # Enqueued: READY, nothing run yet; the time is the database's, read back once committed.
    enqueued, read = seen["enqueued"], seen["read_before_the_worker"]
    assert (enqueued["status"], enqueued["attempts"], enqueued["started_at"]) == ("READY", 0, None)
    assert enqueued["enqueued_at"] is None
    assert read["status"] == "READY"
    assert read["enqueued_at"] is not None
    assert {k: v for k, v in read.items() if k != "enqueued_at"} == {
        k: v for k, v in enqueued.items() if k != "enqueued_at"
    }

    # Run by the worker that `sqlqueue_worker` with no queue named serves: the return value.
    shipped = results["shipped"]
    assert (shipped["status"], shipped["return"], shipped["attempts"]) == (
        "SUCCESSFUL",
        "shipped book",
        1,
    )
    shipped_items = rows(backend.engine, "SELECT item FROM shop_shipment ORDER BY item")
    assert shipped_items == [("book",), ("lamp",)]  # once each: the lamp's through the views
    moments = [datetime.fromisoformat(shipped[k]) for k in ("enqueued_at", "started_at")]
    moments.append(datetime.fromisoformat(shipped["finished_at"]))
    assert moments == sorted(moments)
    assert job("shipped").result == "shipped book"
    assert job("shipped").job_type == "django.tasks"
    assert all(seen["refreshed_is_read"].values()), seen["refreshed_is_read"]

    # queue_name is the job's queue; it was served because the backend's QUEUES name it, and
    # serving it is no typo: the worker does not warn that no task uses it.
    assert (shipped["queue"], job("shipped").queue) == ("shipping", "shipping")
    assert seen["worker"]["warnings"] == []
    # priority: Django's higher-first, stored as sqlqueue's lower-first, and run in that order.
    assert [job(name).priority for name in ("high", "plain", "low")] == [-10, 0, 10]
    assert [results[name]["priority"] for name in ("high", "plain", "low")] == [10, 0, -10]
    ran_at = [results[name]["return"] for name in ("high", "plain", "low")]
    assert ran_at == sorted(ran_at), ran_at
    # run_after: the job is due then, and waits.
    later = results["later"]
    assert (later["status"], job("later").status) == ("READY", JobStatus.QUEUED)
    assert job("later").next_run_at == datetime.fromisoformat(seen["later_at"])
    assert later["run_after"] == seen["later_at"]

    # A task that raised: FAILED, with the exception's class path and its traceback.
    refused = results["refused"]
    assert (refused["status"], job("refused").status) == ("FAILED", JobStatus.DEAD)
    [error] = refused["errors"]
    assert error["class"] == "shop.task_probes.Refused"
    assert error["traceback"].endswith("shop.task_probes.Refused: out of stock\n")
    # A coroutine task, and one that takes the context of its run.
    assert results["doubled"]["return"] == 42
    introduced = results["introduced"]
    assert introduced["return"] == {
        "greeting": "hello",
        "id": introduced["id"],
        "attempt": 1,
        "status": "RUNNING",
    }

    # Refused: an id that names no Tasks job (the app's own job's id neither), a task no
    # worker could import by its path, and wrong OPTIONS, naming the field.
    assert seen["missing"] == ["999999999", "no-such-id", "1" * 30, str(seen["tick"])]
    assert "'shop.task_probes.<lambda>' cannot be imported by its path" in seen["lambda"]
    assert "module level" in seen["nested"]
    # The backport's own refusals hold, and each left no job behind.
    assert seen["unknown_queue"] == "Queue 'nowhere' is not valid for backend."
    assert seen["naive_run_after"] == "run_after must be an aware datetime."
    assert seen["not_json"].startswith("TypeError: "), seen["not_json"]
    payloads = [job.payload.get("args") for job in queue.jobs()]
    assert ["x"] not in payloads, payloads
    unknown, attempts, database = seen["misconfigured"]
    assert "unknown DATABSE" in unknown
    assert "['MAX_ATTEMPTS']: expected a whole number >= 1, got 0" in attempts
    assert "['DATABASE']: alias: Django's DATABASES has no 'nope'" in database
    # The app's own queue is not the Tasks framework's: its job waits for its own worker.
    tick = queue.get_job(seen["tick"])
    assert tick is not None
    assert tick.status == JobStatus.QUEUED


@pytest.mark.backend_independent(reason="which queues a worker serves, not the database")
def test_a_worker_given_a_queue_on_that_database_serves_the_tasks_framework_too(
    backend: Backend,
):
    seen = tasks_demo(backend.url, "shop.task_probes:queue")
    queue = backend.queue()
    tick = queue.get_job(seen["tick"])
    assert tick is not None
    assert tick.status == JobStatus.SUCCEEDED
    assert seen["results"]["shipped"]["status"] == "SUCCESSFUL"
    assert seen["results"]["high"]["status"] == "SUCCESSFUL"
    assert seen["worker"]["warnings"] == []


def _guide_block(after: str) -> str:
    """The text of the guide's first code block after the line ``after``."""
    text = GUIDE.read_text(encoding="utf-8")
    found = re.search(re.escape(after) + r"\n```python\n(.*?)```", text, re.DOTALL)
    assert found is not None, after
    return found.group(1)


def test_the_guides_tasks_sample_is_what_the_suite_runs():
    """The guide's ``TASKS``, tasks module and views are the test project's, which the test
    above runs: a sample that drifts from working code fails here."""
    settings = (PROJECT / "djproject" / "settings_tasks.py").read_text(encoding="utf-8")
    assert _guide_block("<!-- the settings of tests/frameworks/test_django_tasks.py -->") in (
        settings
    )
    for name in ("shop/tasks.py", "shop/task_views.py"):
        module = (PROJECT / name).read_text(encoding="utf-8")
        assert _guide_block(f"<!-- sample-file: {name} -->") == module, name
