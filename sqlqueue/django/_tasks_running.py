"""Running the Tasks framework's tasks as sqlqueue jobs.

One job type, :data:`~sqlqueue.django._tasks_results.JOB_TYPE`, carries every task: its handler
imports the task by the path in the payload and calls it, so a worker serves tasks of modules
it has never imported (the framework keeps no registry of tasks to declare up front), and
operators see ``django.tasks`` jobs with the task's path in their payload. What the task
returns is the job's result; what it raises fails the attempt, with its traceback, as any
handler's error does. The framework's ``task_started`` and ``task_finished`` signals are sent
around the call, as its own workers send them.

Each database alias has one such queue (:func:`tasks_queue`), shared by the backends and
threads that use it; ``manage.py sqlqueue_worker`` serves it, or adds the job type to the
app's own queue on that database (:func:`serve_tasks`).
"""

from __future__ import annotations

import threading
import traceback
from dataclasses import replace
from typing import Any

from sqlqueue import JobContext, Queue
from sqlqueue.django._lazy import DjangoQueue
from sqlqueue.django._tasks_framework import (
    TaskContext,
    TaskError,
    TaskResultStatus,
    normalize_json,
    task_backends,
    task_finished,
    task_started,
)
from sqlqueue.django._tasks_results import JOB_TYPE

__all__ = ["run_task", "serve_tasks", "tasks_queue"]

_QUEUES: dict[str, DjangoQueue] = {}
_QUEUES_LOCK = threading.Lock()


def tasks_queue(database: str) -> DjangoQueue:
    """The queue of the Tasks framework's jobs on ``DATABASES[database]`` (made once)."""
    with _QUEUES_LOCK:
        queue = _QUEUES.get(database)
        if queue is None:
            queue = DjangoQueue(database)
            serve_tasks(queue)
            _QUEUES[database] = queue
        return queue


def serve_tasks(queue: Queue) -> None:
    """Make ``queue``'s workers run the Tasks framework's jobs too (once per queue)."""
    if JOB_TYPE not in queue.tasks:
        queue.task(JOB_TYPE)(run_task)


def run_task(
    task: str,
    args: list[Any],
    kwargs: dict[str, Any],
    backend: str,
    ctx: JobContext,
    run_after: str | None = None,
) -> Any:
    """Run the framework's task ``task`` (its module path) with ``args`` and ``kwargs``;
    return its return value, made JSON as the framework does."""
    owner = task_backends[backend]
    running = owner.get_result(str(ctx.job_id))
    sender = type(owner)
    task_started.send(sender=sender, task_result=running)
    try:
        if running.task.takes_context:
            value = running.task.call(TaskContext(task_result=running), *args, **kwargs)
        else:
            value = running.task.call(*args, **kwargs)
        value = normalize_json(value)
    except BaseException as error:
        if ctx.attempt >= ctx.max_attempts:  # the last attempt: the task has finished
            failed = replace(
                running,
                status=TaskResultStatus.FAILED,
                finished_at=ctx.now(),
                errors=[*running.errors, _error_of(error)],
            )
            task_finished.send(sender=sender, task_result=failed)
        raise
    succeeded = replace(running, status=TaskResultStatus.SUCCESSFUL, finished_at=ctx.now())
    object.__setattr__(succeeded, "_return_value", value)
    task_finished.send(sender=sender, task_result=succeeded)
    return value


def _error_of(error: BaseException) -> Any:
    kind = type(error)
    return TaskError(
        exception_class_path=f"{kind.__module__}.{kind.__qualname__}",
        traceback="".join(traceback.format_exception(error)),
    )
