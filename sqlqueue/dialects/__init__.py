"""Backends: the explicit mapping from SQLAlchemy dialect names to sqlqueue dialects."""

from __future__ import annotations

from sqlalchemy import Engine

from sqlqueue._errors import UnsupportedDatabase
from sqlqueue.dialects._base import BulkPath, Dialect
from sqlqueue.dialects.mysql import MySQLDialect
from sqlqueue.dialects.postgresql import PostgresDialect
from sqlqueue.dialects.sqlite import SQLiteDialect

__all__ = ["BulkPath", "Dialect", "dialect_for"]

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
