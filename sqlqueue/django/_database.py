"""The SQLAlchemy URL and driver options of a database in Django's ``DATABASES``.

Read from Django's connections, which the test runner points at the test databases; unless
``override_settings(DATABASES=…)`` is in force for the alias: Django's connections do not
follow it (Django warns so), the queue does, so a test can move it to another database.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings as django_settings
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.utils import ConnectionDoesNotExist, load_backend
from sqlalchemy import URL

from sqlqueue._errors import ConfigurationError
from sqlqueue.dialects import with_driver

__all__ = ["connect_options", "database_url", "overridden", "settings_of"]

#: ``OPTIONS`` that Django reads itself and never hands to the driver.
_DJANGO_OPTIONS = frozenset(
    {"isolation_level", "server_side_binding", "pool", "assume_role"}
    | {"init_command", "transaction_mode"}
)


def overridden(alias: str) -> dict[str, Any] | None:
    """``DATABASES[alias]`` when ``override_settings`` replaced it (or added the alias) after
    Django's connections read it, with Django's defaults filled in; else ``None``."""
    entry = getattr(django_settings, "DATABASES", {}).get(alias)
    if not isinstance(entry, dict):
        return None
    known = connections.settings.get(alias)
    if entry is known or (known is not None and entry is connections[alias].settings_dict):
        return None
    databases: dict[str, Any] = {DEFAULT_DB_ALIAS: {}}  # Django requires a default alias
    databases[alias] = dict(entry)
    filled: dict[str, Any] = connections.configure_settings(databases)[alias]
    return filled


def settings_of(alias: str) -> dict[str, Any]:
    """Django's settings of ``DATABASES[alias]`` as its connections read them now, or as
    ``override_settings`` replaced them."""
    replaced = overridden(alias)
    if replaced is not None:
        return replaced
    try:
        settings: dict[str, Any] = connections[alias].settings_dict
    except ConnectionDoesNotExist:
        raise ConfigurationError(f"alias: Django's DATABASES has no {alias!r}") from None
    return settings


def database_url(alias: str = DEFAULT_DB_ALIAS) -> URL:
    """The URL of ``DATABASES[alias]`` with the driver sqlqueue uses for that database."""
    settings = settings_of(alias)
    port = settings.get("PORT")
    replaced = overridden(alias)
    vendor = (
        connections[alias].vendor
        if replaced is None
        else load_backend(replaced["ENGINE"]).DatabaseWrapper.vendor
    )
    try:
        return with_driver(
            URL.create(
                drivername=vendor,
                username=settings.get("USER") or None,
                password=settings.get("PASSWORD") or None,
                host=settings.get("HOST") or None,
                port=int(port) if port else None,
                database=str(settings["NAME"]) if settings.get("NAME") else None,
            )
        )
    except ValueError as error:
        raise ConfigurationError(f"DATABASES[{alias!r}]: {error}") from None


def connect_options(alias: str = DEFAULT_DB_ALIAS) -> dict[str, Any]:
    """``DATABASES[alias]["OPTIONS"]`` that Django passes to the driver's ``connect``."""
    options = settings_of(alias).get("OPTIONS") or {}
    return {key: value for key, value in options.items() if key not in _DJANGO_OPTIONS}
