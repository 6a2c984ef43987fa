"""Django's Tasks framework, wherever it comes from: ``django.tasks`` (Django 6 and later) when
Django has it, else the ``django-tasks`` backport (``pip install django-tasks``). The one module
that makes that choice; the rest of sqlqueue's Tasks backend imports these names from here.

The backport named ``InvalidTask`` and ``InvalidTaskBackend`` ``InvalidTaskError`` and
``InvalidTaskBackendError`` until its version 0.13; either name is found.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING

from django.core.exceptions import ImproperlyConfigured

__all__ = [
    "BaseTaskBackend",
    "InvalidTask",
    "InvalidTaskBackend",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "normalize_json",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]


def _module(*names: str) -> ModuleType:
    """The first of ``names`` that imports."""
    for name in names:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise ImproperlyConfigured(
        "sqlqueue.django.tasks.Backend needs Django's Tasks framework: Django >= 6.0 has it "
        "(django.tasks); on older Django install the backport: pip install django-tasks"
    )


if TYPE_CHECKING:
    from django_tasks import task_backends
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
    from django_tasks.exceptions import InvalidTaskBackendError as InvalidTaskBackend
    from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.exceptions import TaskResultDoesNotExist
    from django_tasks.signals import task_enqueued, task_finished, task_started
    from django_tasks.utils import normalize_json
else:
    _framework = _module("django.tasks", "django_tasks")
    _name = _framework.__name__
    _base = importlib.import_module(f"{_name}.base")
    _backends = importlib.import_module(f"{_name}.backends.base")
    _exceptions = importlib.import_module(f"{_name}.exceptions")
    _signals = importlib.import_module(f"{_name}.signals")
    _json = _module("django.utils.json", f"{_name}.utils")

    Task = _base.Task
    TaskContext = _base.TaskContext
    TaskResult = _base.TaskResult
    TaskResultStatus = _base.TaskResultStatus
    task_backends = _framework.task_backends
    BaseTaskBackend = _backends.BaseTaskBackend
    TaskError = _base.TaskError
    InvalidTask = getattr(_exceptions, "InvalidTask", None) or _exceptions.InvalidTaskError
    InvalidTaskBackend = (
        getattr(_exceptions, "InvalidTaskBackend", None) or _exceptions.InvalidTaskBackendError
    )
    TaskResultDoesNotExist = _exceptions.TaskResultDoesNotExist
    task_enqueued = _signals.task_enqueued
    task_started = _signals.task_started
    task_finished = _signals.task_finished
    normalize_json = _json.normalize_json
