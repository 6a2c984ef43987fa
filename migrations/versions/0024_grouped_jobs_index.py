"""The per-key ordering index holds only the jobs that have a group key.

``ix_sqlqueue_jobs_group`` indexed every unfinished job, with or without a group key. On
PostgreSQL an update that changes an indexed column (every status change does) writes a new
entry into each index whose predicate the new row meets, so a plain job's claim wrote a NULL
key into this index that no query reads: ordering looks up jobs by their group's key
(``group_key = …``), which implies ``group_key IS NOT NULL``. SQLite's partial indexes work the
same way. MariaDB/MySQL have no partial indexes, and InnoDB updates a secondary index only when
its own columns change: nothing to do there.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None

_INDEX = "ix_sqlqueue_jobs_group"
_UNFINISHED = "status IN ('queued', 'failed', 'running')"
_GROUPED = sa.text(f"{_UNFINISHED} AND group_key IS NOT NULL")


def _replace(where: sa.TextClause) -> None:
    if op.get_bind().dialect.name not in ("postgresql", "sqlite"):
        return
    op.drop_index(_INDEX, table_name="sqlqueue_jobs")
    op.create_index(
        _INDEX,
        "sqlqueue_jobs",
        ["group_key", "id"],
        postgresql_where=where,
        sqlite_where=where,
    )


def upgrade() -> None:
    _replace(_GROUPED)


def downgrade() -> None:
    _replace(sa.text(_UNFINISHED))
