"""sqlqueue's revision 0024 (the per-key ordering index holds grouped jobs only) for a database
that Django migrated with an older release (see ``sqlqueue.django._tables.RevisionsMigration``).
"""

from __future__ import annotations

from typing import ClassVar

from sqlqueue.django._tables import RevisionsMigration


class Migration(RevisionsMigration):
    """sqlqueue's tables at ``sqlqueue_revision`` at least."""

    dependencies: ClassVar[list[tuple[str, str]]] = [("sqlqueue", "0002_claim_by_type")]
    #: ``sqlqueue._schema.SCHEMA_REVISION`` when this migration was written.
    sqlqueue_revision = "0024"
