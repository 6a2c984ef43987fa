"""sqlqueue's revision 0023 (SQLite: the claimable jobs by queue and job type) for a database
that Django migrated with an older release (see ``sqlqueue.django._tables.RevisionsMigration``).
"""

from __future__ import annotations

from typing import ClassVar

from sqlqueue.django._tables import RevisionsMigration


class Migration(RevisionsMigration):
    """sqlqueue's tables at ``sqlqueue_revision`` at least."""

    dependencies: ClassVar[list[tuple[str, str]]] = [("sqlqueue", "0001_sqlqueue_tables")]
    #: ``sqlqueue._schema.SCHEMA_REVISION`` when this migration was written.
    sqlqueue_revision = "0023"
