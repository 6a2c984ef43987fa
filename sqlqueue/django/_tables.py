"""sqlqueue's tables in a database of Django's, made on the connection Django migrates with.

Django's ``migrate`` (and its test runner, which migrates each test database) runs sqlqueue's
Django migration, which runs sqlqueue's own revisions (alembic, the same as ``sqlqueue
migrate``) on Django's connection, in one transaction of their own, after the database-wide
settings sqlqueue's own connections would make (SQLite's WAL journal).
sqlqueue's version table stays its own, so Django's migrations and sqlqueue's never mix.
"""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import migrations
from django.db.backends.base.base import BaseDatabaseWrapper

from sqlqueue._migrate import upgrade
from sqlqueue.dialects import dialect_for
from sqlqueue.django._shared import shared_connection

__all__ = ["RevisionsMigration", "migrate_connection", "run_revisions"]


def migrate_connection(wrapper: BaseDatabaseWrapper, schema: str | None = None) -> None:
    """Bring sqlqueue's tables to the latest revision on Django connection ``wrapper``."""
    shared = shared_connection(wrapper)
    dialect = dialect_for(shared.engine, schema)
    if not wrapper.in_atomic_block:
        dialect.configure_database(shared.raw)
    upgrade(shared.engine, dialect, schema=schema)


def run_revisions(apps: Any, schema_editor: Any) -> None:
    """sqlqueue's revisions, up to the latest, on the connection being migrated."""
    migrate_connection(schema_editor.connection)


class RevisionsMigration(migrations.Migration):
    """The Django migration each release with a new revision adds (with its ``dependencies``
    and ``sqlqueue_revision``), for a database that Django migrated with an older release:
    ``manage.py migrate`` runs sqlqueue's revisions up to the latest again, as
    ``0001_sqlqueue_tables`` does (on a new database 0001 has run them all already, and this
    one finds nothing to do). No transaction around it, for the reasons 0001 gives."""

    atomic = False
    operations: ClassVar[list[migrations.RunPython]] = [
        migrations.RunPython(
            run_revisions, migrations.RunPython.noop, atomic=False, elidable=False
        ),
    ]
