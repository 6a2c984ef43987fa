"""sqlqueue's tables, by sqlqueue's own revisions on the connection Django migrates with.

A release that adds a revision adds a Django migration (a ``RevisionsMigration`` of
``sqlqueue/django/_tables.py`` with its ``sqlqueue_revision``, as 0002 and 0003 are), so that
``manage.py migrate`` upgrades the tables too; a test holds the latest one's
``sqlqueue_revision`` to the schema's.
"""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import migrations

from sqlqueue.django._tables import migrate_connection


def create_tables(apps: Any, schema_editor: Any) -> None:
    """sqlqueue's revisions, up to the latest, on the connection being migrated."""
    migrate_connection(schema_editor.connection)


class Migration(migrations.Migration):
    """sqlqueue's tables (its revisions up to ``sqlqueue_revision`` at least)."""

    initial = True
    # No transaction around it: the revisions run in one of their own, after settings a
    # database takes only outside one (SQLite's WAL journal); and on MariaDB and MySQL each
    # DDL statement commits, which would end a transaction Django opened around them.
    atomic = False
    dependencies: ClassVar[list[tuple[str, str]]] = []
    #: ``sqlqueue._schema.SCHEMA_REVISION`` when this migration was written.
    sqlqueue_revision = "0022"
    operations: ClassVar[list[migrations.RunPython]] = [
        migrations.RunPython(
            create_tables, migrations.RunPython.noop, atomic=False, elidable=False
        ),
    ]
