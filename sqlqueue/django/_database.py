"""The SQLAlchemy URL and driver options of a database in Django's ``DATABASES``."""

from __future__ import annotations

from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.utils import ConnectionDoesNotExist
from sqlalchemy import URL

from sqlqueue._errors import ConfigurationError
from sqlqueue.dialects import with_driver

__all__ = ["connect_options", "database_url", "settings_of"]

#: ``OPTIONS`` that Django reads itself and never hands to the driver.
_DJANGO_OPTIONS = frozenset(
    {"isolation_level", "server_side_binding", "pool", "assume_role"}
    | {"init_command", "transaction_mode"}
)


def settings_of(alias: str) -> dict[str, Any]:
    """Django's settings of ``DATABASES[alias]`` as its connections read them now."""
    try:
        settings: dict[str, Any] = connections[alias].settings_dict
    except ConnectionDoesNotExist:
        raise ConfigurationError(f"alias: Django's DATABASES has no {alias!r}") from None
    return settings


def database_url(alias: str = DEFAULT_DB_ALIAS) -> URL:
    """The URL of ``DATABASES[alias]`` with the driver sqlqueue uses for that database."""
    settings = settings_of(alias)
    port = settings.get("PORT")
    try:
        return with_driver(
            URL.create(
                drivername=connections[alias].vendor,
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
