"""sqlqueue in a Django project (extra ``[django]``): add ``"sqlqueue.django"`` to
``INSTALLED_APPS``.

- :func:`queue` builds the :class:`~sqlqueue.Queue` on the database of ``DATABASES[alias]``.
- ``task.enqueue(django.db.connection, …)`` (or ``connections[alias]``) writes the job on
  Django's own connection, in its current ``transaction.atomic()`` block: gone with its
  rollback, visible when it commits.
- ``python manage.py sqlqueue_worker myapp.jobs:queue`` runs a worker with Django set up (the
  arguments of ``sqlqueue worker``); ``python manage.py sqlqueue_migrate`` creates sqlqueue's
  tables in Django's database.
"""

from __future__ import annotations

from typing import Any

from django.db import DEFAULT_DB_ALIAS
from sqlalchemy import create_engine

from sqlqueue._liveness import check_connections_at_checkout
from sqlqueue._queue import Queue
from sqlqueue.django import _connection  # noqa: F401 - Django's connections become enqueue targets
from sqlqueue.django._database import connect_options, database_url

__all__ = ["database_url", "queue"]


def queue(alias: str = DEFAULT_DB_ALIAS, **queue_options: Any) -> Queue:
    """A :class:`~sqlqueue.Queue` on the database of Django's ``DATABASES[alias]``
    (PostgreSQL, SQLite, MariaDB/MySQL), with its ``OPTIONS`` for the driver.

    ``queue_options`` are :class:`~sqlqueue.Queue`'s (``lease_seconds``, ``retention`` …).
    Its workers open connections of their own; enqueueing uses Django's (see the module)."""
    engine = create_engine(database_url(alias), connect_args=connect_options(alias))
    built = Queue(engine, **queue_options)
    if built.dialect.supports_many_hosts:
        # As Queue does for a URL: a pooled connection the server dropped while idle is
        # replaced at checkout rather than failing a worker's next claim.
        check_connections_at_checkout(engine, built.dialect)
    return built
