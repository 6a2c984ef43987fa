"""sqlqueue's revision 0024 (the per-key ordering index holds grouped jobs only) for a database
that Django migrated with an older release: ``manage.py migrate`` runs sqlqueue's revisions up
to the latest again, as ``0001_sqlqueue_tables`` does (on a new database 0001 has run them
all already, and this one finds nothing to do).
"""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import migrations

from sqlqueue.django._tables import migrate_connection


def upgrade_tables(apps: Any, schema_editor: Any) -> None:
    """sqlqueue's revisions, up to the latest, on the connection being migrated."""
    migrate_connection(schema_editor.connection)


class Migration(migrations.Migration):
    """sqlqueue's tables at ``sqlqueue_revision`` at least."""

    # No transaction around it, for the reasons 0001 gives.
    atomic = False
    dependencies: ClassVar[list[tuple[str, str]]] = [("sqlqueue", "0002_claim_by_type")]
    #: ``sqlqueue._schema.SCHEMA_REVISION`` when this migration was written.
    sqlqueue_revision = "0024"
    operations: ClassVar[list[migrations.RunPython]] = [
        migrations.RunPython(
            upgrade_tables, migrations.RunPython.noop, atomic=False, elidable=False
        ),
    ]
