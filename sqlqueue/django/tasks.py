"""A backend for Django's Tasks framework (``django.tasks`` on Django 6, the ``django-tasks``
backport before): tasks written with the framework's ``@task`` run as sqlqueue jobs.

.. code-block:: python

    TASKS = {"default": {"BACKEND": "sqlqueue.django.tasks.Backend"}}

``task.enqueue(…)`` writes the job on Django's connection of the backend's database, in the
caller's ``transaction.atomic()`` block (rolled back with it, invisible until it commits);
``python manage.py sqlqueue_worker`` runs the jobs; ``get_result()`` and
``TaskResult.refresh()`` read the job back. ``priority``, ``queue_name`` and ``run_after`` are
the job's. The code that enqueues and the tasks know only the framework: swapping the backend
for another one changes the settings, nothing else.

``OPTIONS``: ``DATABASE`` (the alias in ``DATABASES``, default ``"default"``) and
``MAX_ATTEMPTS`` (default 1: the framework runs a task once; more retries a task that raised,
with sqlqueue's backoff, and each failed attempt is one of the result's ``errors``).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.apps import apps
from django.core import checks
from django.db import DEFAULT_DB_ALIAS, connections
from django.utils import timezone

from sqlqueue import ConfigurationError, JobStatus
from sqlqueue.django._tasks_framework import (
    BaseTaskBackend,
    InvalidTask,
    InvalidTaskBackend,
    Task,
    TaskResult,
    TaskResultDoesNotExist,
    normalize_json,
    task_enqueued,
)
from sqlqueue.django._tasks_results import (
    JOB_TYPE,
    sqlqueue_priority,
    task_at,
    task_result,
    task_status,
)
from sqlqueue.django._tasks_running import tasks_queue

__all__ = ["Backend"]

_OPTIONS = frozenset({"DATABASE", "MAX_ATTEMPTS"})


class Backend(BaseTaskBackend):
    """The Tasks framework's backend on sqlqueue (see the module)."""

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        unknown = sorted(set(self.options) - _OPTIONS)
        if unknown:
            raise InvalidTaskBackend(
                f"TASKS[{alias!r}]['OPTIONS']: unknown {', '.join(unknown)}; sqlqueue's backend "
                "takes DATABASE (an alias of DATABASES) and MAX_ATTEMPTS"
            )
        #: The alias in ``DATABASES`` whose database holds the jobs.
        self.database: str = self.options.get("DATABASE", DEFAULT_DB_ALIAS)
        max_attempts = self.options.get("MAX_ATTEMPTS", 1)
        if type(max_attempts) is not int or max_attempts < 1:
            raise InvalidTaskBackend(
                f"TASKS[{alias!r}]['OPTIONS']['MAX_ATTEMPTS']: expected a whole number >= 1, "
                f"got {max_attempts!r}"
            )
        self.max_attempts: int = max_attempts
        try:
            self.queue = tasks_queue(self.database)
        except ConfigurationError as error:
            raise InvalidTaskBackend(f"TASKS[{alias!r}]['OPTIONS']['DATABASE']: {error}") from None

    def enqueue(self, task: Task[Any, Any], args: Any, kwargs: Any) -> TaskResult[Any]:
        """Write the task's job in the current transaction of Django's connection to the
        backend's database; the result is ``READY``, its ``enqueued_at`` the database's,
        known to ``get_result()``/``refresh()`` once the transaction has committed."""
        self.validate_task(task)
        _check_importable(task)
        arguments = normalize_json({"args": args, "kwargs": kwargs})
        run_after = _aware(task.run_after)
        job_id = self.queue.enqueue(
            connections[self.database],
            JOB_TYPE,
            {
                "task": task.module_path,
                "args": arguments["args"],
                "kwargs": arguments["kwargs"],
                "backend": self.alias,
                "run_after": None if run_after is None else run_after.isoformat(),
            },
            priority=sqlqueue_priority(task.priority),
            queue=task.queue_name,
            run_at=run_after,
            max_attempts=self.max_attempts,
        )
        result: TaskResult[Any] = TaskResult(
            task=task,
            id=str(job_id),
            status=task_status(JobStatus.QUEUED),
            enqueued_at=None,
            started_at=None,
            last_attempted_at=None,
            finished_at=None,
            args=arguments["args"],
            kwargs=arguments["kwargs"],
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> TaskResult[Any]:
        """The result of the job ``result_id``, as committed now; ``TaskResultDoesNotExist``
        for an id that names no job of the Tasks framework."""
        job_id = _job_id(result_id)
        try:
            job = None if job_id is None else self.queue.get_job(job_id)
        except ConfigurationError:  # beyond the range of the id column
            job = None
        if job is None or job.job_type != JOB_TYPE:
            raise TaskResultDoesNotExist(result_id)
        return task_result(job)

    def check(self, **kwargs: Any) -> Iterable[checks.CheckMessage]:
        """The framework's checks, and sqlqueue's app, whose migration makes the tables."""
        yield from super().check(**kwargs)
        if not apps.is_installed("sqlqueue.django"):
            yield checks.Error(
                f"TASKS[{self.alias!r}] is sqlqueue's backend, but sqlqueue's app is not "
                "installed: its migration makes the tables the jobs are written to",
                hint="Add 'sqlqueue.django' to INSTALLED_APPS.",
                id="sqlqueue.E001",
            )


def _check_importable(task: Task[Any, Any]) -> None:
    """A worker finds the task by its path: refuse one it could not find, now."""
    path = task.module_path
    try:
        found = task_at(path)
    except Exception:
        found = None
    if found is None or found.func is not task.func:
        raise InvalidTask(
            f"the task {path!r} cannot be imported by its path, so no worker could run it: "
            "define it at the top level of a module, decorated with @task, under the name of "
            "its function"
        )


def _aware(moment: datetime | None) -> datetime | None:
    """``run_after`` as an aware time (a naive one, allowed with ``USE_TZ = False``, is in
    Django's time zone)."""
    if moment is None or timezone.is_aware(moment):
        return moment
    aware: datetime = timezone.make_aware(moment)
    return aware


def _job_id(result_id: str) -> int | None:
    """The job id ``result_id`` spells (ASCII digits only), or ``None``."""
    if not isinstance(result_id, str) or not (result_id.isascii() and result_id.isdigit()):
        return None
    return int(result_id)
