"""sqlqueue's tables in a database of Django's, made on the connection Django migrates with.

Django's ``migrate`` (and its test runner, which migrates each test database) runs sqlqueue's
Django migration, which runs sqlqueue's own revisions (alembic, the same as ``sqlqueue
migrate``) on Django's connection, in one transaction of their own, after the database-wide
settings sqlqueue's own connections would make (SQLite's WAL journal).
sqlqueue's version table stays its own, so Django's migrations and sqlqueue's never mix.
"""

from __future__ import annotations

from django.db.backends.base.base import BaseDatabaseWrapper

from sqlqueue._migrate import upgrade
from sqlqueue.dialects import dialect_for
from sqlqueue.django._shared import shared_connection

__all__ = ["migrate_connection"]


def migrate_connection(wrapper: BaseDatabaseWrapper, schema: str | None = None) -> None:
    """Bring sqlqueue's tables to the latest revision on Django connection ``wrapper``."""
    shared = shared_connection(wrapper)
    dialect = dialect_for(shared.engine, schema)
    if not wrapper.in_atomic_block:
        dialect.configure_database(shared.raw)
    upgrade(shared.engine, dialect, schema=schema)
