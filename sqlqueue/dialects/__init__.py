"""Backends: the explicit mapping from SQLAlchemy dialect names to sqlqueue dialects."""

from __future__ import annotations

from sqlalchemy import URL, Engine, make_url

from sqlqueue._errors import UnsupportedDatabase
from sqlqueue.dialects._base import BulkPath, Dialect
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
    "LOCK_TIMEOUT_MS",
    "BulkPath",
    "Dialect",
    "HistoryPartition",
    "HistoryPartitions",
    "dialect_for",
    "driver_hint",
    "history_partitions_of",
    "with_driver",
]

_DIALECTS: dict[str, type[Dialect]] = {
    name: cls for cls in (SQLiteDialect, PostgresDialect, MySQLDialect) for name in cls.names
}


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


def with_driver(url: str | URL) -> URL:
    """``url`` with sqlqueue's driver when it names only the database: ``mysql://`` and
    ``mariadb://`` use PyMySQL (SQLAlchemy's default, mysqlclient, needs a C client library),
    ``postgresql://`` psycopg 3, as SQLAlchemy 2.1 already does."""
    parsed = make_url(url)
    cls = _DIALECTS.get(parsed.get_backend_name())
    if cls is None or cls.driver is None or "+" in parsed.drivername:
        return parsed
    return parsed.set(drivername=f"{parsed.drivername}+{cls.driver}")


def driver_hint(url: str | URL) -> str:
    """What to install for ``url``'s driver: the sqlqueue extra of its database, and the URL
    form that uses it when ``url`` names a driver sqlqueue does not install."""
    parsed = make_url(url)
    cls = _DIALECTS.get(parsed.get_backend_name())
    if cls is None or cls.extra is None:
        return "install the driver its URL names"
    hint = f'pip install "sqlqueue[{cls.extra}]"'
    if parsed.get_driver_name() != cls.driver:
        hint += f" and use {parsed.get_backend_name()}+{cls.driver}://…"
    return hint
