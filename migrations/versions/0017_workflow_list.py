"""The web page's Workflows list on a big table: the workflows' ids in an index of their own,
so the newest page of workflows is read without passing over the plain batches among them.

PostgreSQL and SQLite only (a partial index); MariaDB has none, and there the list reads the
batches' primary key backwards, skipping plain batches (see sqlqueue/_schema.py).

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

_WORKFLOWS = sa.text("workflow_on_dead IS NOT NULL")


def _partial_indexes() -> bool:
    return op.get_bind().dialect.name in ("postgresql", "sqlite")


def upgrade() -> None:
    if _partial_indexes():
        op.create_index(
            "ix_sqlqueue_batches_workflows",
            "sqlqueue_batches",
            ["id"],
            postgresql_where=_WORKFLOWS,
            sqlite_where=_WORKFLOWS,
        )


def downgrade() -> None:
    if _partial_indexes():
        op.drop_index("ix_sqlqueue_batches_workflows", table_name="sqlqueue_batches")
