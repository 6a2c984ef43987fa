"""Tasks of Django's Tasks framework that the suite runs on sqlqueue's backend, each showing
one thing the framework expects of a backend; and a queue of the app's own beside them."""

import time
from typing import Any

from django_tasks import TaskContext, task

import sqlqueue.django

#: The app's own queue, on the database of the Tasks framework's jobs.
queue = sqlqueue.django.queue()


class Refused(Exception):
    """What ``refuse`` raises: an exception class of the project's."""


@task()
def stamp(label: str) -> int:
    """The worker process's monotonic clock when it ran: the order the tasks ran in."""
    return time.monotonic_ns()


@task()
def refuse(reason: str) -> None:
    """A task that fails."""
    raise Refused(reason)


@task()
async def double(number: int) -> int:
    """A coroutine task."""
    return 2 * number


@task(takes_context=True)
def introduce(context: TaskContext, greeting: str) -> dict[str, Any]:
    """What the task's context says about its run."""
    result = context.task_result
    return {
        "greeting": greeting,
        "id": result.id,
        "attempt": context.attempt,
        "status": str(result.status),
    }


#: A task the framework takes but no worker could import by its path.
anonymous = task()(lambda: None)


@queue.task("tick")
def tick() -> str:
    """A job of the app's own queue."""
    return "tick"
