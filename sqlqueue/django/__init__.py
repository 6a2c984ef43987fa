"""sqlqueue in a Django project (extra ``[django]``): add ``"sqlqueue.django"`` to
``INSTALLED_APPS``.

- :func:`queue` builds the :class:`~sqlqueue.Queue` on the database of ``DATABASES[alias]``,
  read when the queue is used rather than when it is built: Django's test runner (and
  anything else that points the alias elsewhere) moves it along.
- ``python manage.py migrate`` creates sqlqueue's tables (a migration of this app runs
  sqlqueue's own revisions), so Django's test runner makes them in each test database.
- ``task.enqueue(django.db.connection, …)`` (or ``connections[alias]``) writes the job on
  Django's own connection, in its current ``transaction.atomic()`` block: gone with its
  rollback, visible when it commits.
- ``python manage.py sqlqueue_worker myapp.jobs:queue`` runs a worker with Django set up (the
  arguments of ``sqlqueue worker``); its handlers' threads close Django's broken or expired
  connections around each job, as Django's request cycle does.
- In a ``TestCase`` (and on Django's in-memory SQLite test database) the queue runs on the
  test's own connection, so ``sqlqueue.testing``'s helpers see and run what the test enqueued.
"""

from __future__ import annotations

from typing import Any

from django.db import DEFAULT_DB_ALIAS

from sqlqueue._queue import Queue
from sqlqueue.django import _connection  # noqa: F401 - Django's connections become enqueue targets
from sqlqueue.django._database import database_url
from sqlqueue.django._lazy import DjangoQueue

__all__ = ["database_url", "queue"]


def queue(alias: str = DEFAULT_DB_ALIAS, **queue_options: Any) -> Queue:
    """A :class:`~sqlqueue.Queue` on the database of Django's ``DATABASES[alias]``
    (PostgreSQL, SQLite, MariaDB/MySQL), with its ``OPTIONS`` for the driver.

    The alias is read at each use, not now: build the queue at the top of your tasks module,
    and tests (Django's test runner, ``TestCase``) still get the test database.
    ``queue_options`` are :class:`~sqlqueue.Queue`'s (``lease_seconds``, ``retention`` …).
    Its workers open connections of their own; enqueueing uses Django's (see the module)."""
    return DjangoQueue(alias, **queue_options)
