"""What ``manage.py sqlqueue_worker`` serves when ``TASKS`` has sqlqueue's backend.

- No queue named (``manage.py sqlqueue_worker [options]``): the Tasks framework's jobs, on the
  database of the sqlqueue backends in ``TASKS``, in the queues their ``QUEUES`` allow.
- ``module:attribute`` of a queue on that same database (``sqlqueue.django.queue(alias)``):
  that queue's tasks and the Tasks framework's jobs, in the queues of both.
- Anything else, or no sqlqueue backend in ``TASKS``: exactly what ``sqlqueue worker`` does.

``--queues`` given on the command line is left as it is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.management.base import CommandError
from django.utils.module_loading import import_string

from sqlqueue import Queue
from sqlqueue.cli import build_parser
from sqlqueue.cli._common import UsageError
from sqlqueue.cli._worker_cmd import load_queue
from sqlqueue.django._lazy import DjangoQueue

if TYPE_CHECKING:
    from sqlqueue.django.tasks import Backend

__all__ = ["worker_call"]


def worker_call(arguments: Sequence[str], prog: str) -> tuple[list[str], Queue | None]:
    """The ``sqlqueue`` command line to run, and the queue to run it on (``None``: the one
    the command line names)."""
    backends = _sqlqueue_backends()
    as_given = ["worker", *arguments]
    if not backends:
        return as_given, None
    if arguments and not arguments[0].startswith("-"):
        queue = _loaded(arguments[0])
        if not isinstance(queue, DjangoQueue):
            return as_given, None  # not on a database of Django's (or not loadable: main says)
        backends = [backend for backend in backends if backend.database == queue.alias]
        if not backends:
            return as_given, None
        options = list(arguments[1:])
    else:
        databases = sorted({backend.database for backend in backends})
        if len(databases) > 1:
            raise CommandError(
                "TASKS has sqlqueue backends on several databases "
                f"({', '.join(databases)}); a worker serves one: run one per database, each "
                "with a queue of that database (sqlqueue.django.queue(alias)) as MODULE:ATTRIBUTE"
            )
        queue = backends[0].queue
        options = list(arguments)
    from sqlqueue.django._tasks_running import serve_tasks

    serve_tasks(queue)
    for backend in backends:  # their tasks' jobs go to these queues: serving one is no typo
        queue._enqueued_elsewhere |= set(backend.queues)
    return ["worker", *options, *_queues_option(options, backends, queue, prog)], queue


def _sqlqueue_backends() -> list[Backend]:
    """The backends of ``TASKS`` that are sqlqueue's, as the framework made them."""
    configured = getattr(settings, "TASKS", None)
    if not isinstance(configured, Mapping):
        return []
    aliases = []
    for alias, config in configured.items():
        path = config.get("BACKEND") if isinstance(config, Mapping) else None
        try:
            backend_class = import_string(path) if isinstance(path, str) else None
        except ImportError:
            continue  # the framework says so when the backend is used
        if isinstance(backend_class, type) and _is_sqlqueues(backend_class):
            aliases.append(alias)
    if not aliases:
        return []
    from sqlqueue.django._tasks_framework import task_backends

    return [task_backends[alias] for alias in aliases]


def _is_sqlqueues(backend_class: type[Any]) -> bool:
    from sqlqueue.django.tasks import Backend

    return issubclass(backend_class, Backend)


def _loaded(target: str) -> Queue | None:
    try:
        return load_queue(target)
    except UsageError:
        return None  # run as given: sqlqueue worker says what is wrong with it


def _queues_option(
    options: Sequence[str], backends: Sequence[Backend], queue: Queue, prog: str
) -> list[str]:
    """``--queues`` for the queues the backends allow and the queue's tasks use, unless the
    command line names the queues itself."""
    if build_parser(prog, given=True).parse_args(["worker", *options]).queues:
        return []
    names = {task.queue for task in queue.tasks.values()} | {queue.default_queue}
    for backend in backends:
        if not backend.queues:
            raise CommandError(
                f"TASKS[{backend.alias!r}] allows any queue name (its QUEUES is empty), so "
                "the worker cannot tell which to serve: name them with --queues"
            )
        names |= set(backend.queues)
    return ["--queues", ",".join(sorted(names))]
