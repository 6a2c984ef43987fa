"""Backends: the explicit mapping from SQLAlchemy dialect names to sqlqueue dialects."""

from __future__ import annotations

from sqlalchemy import URL, Engine, make_url

from sqlqueue._errors import UnsupportedDatabase
from sqlqueue.dialects._base import BORROWED, BulkPath, Dialect, is_borrowed
from sqlqueue.dialects._claiming import status_literal
from sqlqueue.dialects._history import (
    LOCK_TIMEOUT_MS,
    HistoryPartition,
    HistoryPartitions,
    history_partitions_of,
)
from sqlqueue.dialects.mysql import MySQLDialect
from sqlqueue.dialects.postgresql import PostgresDialect
from sqlqueue.dialects.sqlite import SQLiteDialect

__all__ = [
    "BORROWED",
    "LOCK_TIMEOUT_MS",
    "BulkPath",
    "Dialect",
    "HistoryPartition",
    "HistoryPartitions",
    "dialect_for",
    "driver_hint",
    "history_partitions_of",
    "is_borrowed",
    "status_literal",
    "with_driver",
]

_CLASSES: tuple[type[Dialect], ...] = (SQLiteDialect, PostgresDialect, MySQLDialect)
_DIALECTS: dict[str, type[Dialect]] = {name: cls for cls in _CLASSES for name in cls.names}


def dialect_for(engine: Engine, schema: str | None = None) -> Dialect:
    """The sqlqueue dialect for ``engine`` (its tables in ``schema``, where the database has
    schemas), or a clear error naming what is supported."""
    cls = _DIALECTS.get(engine.dialect.name)
    if cls is None:
        supported = ", ".join(sorted(_DIALECTS))
        raise UnsupportedDatabase(
            f"sqlqueue does not support the {engine.dialect.name!r} database yet "
            f"(supported: {supported})"
        )
    return cls(schema)


#: A URL's other names for a database, and the SQLAlchemy name each stands for.
_ALIASES: dict[str, str] = {alias: cls.names[0] for cls in _CLASSES for alias in cls.url_aliases}


def with_driver(url: str | URL) -> URL:
    """``url`` with sqlqueue's driver when it names only the database: ``mysql://`` and
    ``mariadb://`` use PyMySQL (SQLAlchemy's default, mysqlclient, needs a C client library),
    ``postgresql://`` psycopg 3, as SQLAlchemy 2.1 already does. ``postgres://``, which
    hosting providers hand out and SQLAlchemy no longer reads, is taken as ``postgresql://``."""
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend in _ALIASES:
        parsed = parsed.set(drivername=_ALIASES[backend] + parsed.drivername[len(backend) :])
    cls = _DIALECTS.get(parsed.get_backend_name())
    if cls is None or cls.driver is None or "+" in parsed.drivername:
        return parsed
    return parsed.set(drivername=f"{parsed.drivername}+{cls.driver}")


def driver_hint(url: str | URL) -> str:
    """What to install for ``url``'s driver: the sqlqueue extra of its database, and the URL
    form that uses it when ``url`` names a driver sqlqueue does not install."""
    parsed = with_driver(url)
    cls = _DIALECTS.get(parsed.get_backend_name())
    if cls is None or cls.extra is None:
        return "install the driver its URL names"
    hint = f'pip install "sqlalchemy-sqlqueue[{cls.extra}]"'
    if parsed.get_driver_name() != cls.driver:
        hint += f" and use {parsed.get_backend_name()}+{cls.driver}://…"
    return hint
