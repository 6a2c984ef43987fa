"""The Django app: ``"sqlqueue.django"`` in ``INSTALLED_APPS`` brings the management commands
and lets enqueue write through Django's connections."""

from __future__ import annotations

from django.apps import AppConfig

# Imported for its effect: Django's connections become something enqueue writes through.
from sqlqueue.django import _connection  # noqa: F401

__all__ = ["SqlqueueConfig"]


class SqlqueueConfig(AppConfig):
    """sqlqueue's app: no models; its migration runs sqlqueue's own revisions (``_tables.py``)."""

    name = "sqlqueue.django"
    label = "sqlqueue"
    verbose_name = "sqlqueue"
