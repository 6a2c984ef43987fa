"""Flow control: group_key for per-key ordering, cancel_requested_at for stopping a running job.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.mysql import DATETIME

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_UNFINISHED = sa.text("status IN ('queued', 'failed', 'running')")


def upgrade() -> None:
    with op.batch_alter_table("sqlqueue_jobs") as batch:
        batch.add_column(sa.Column("group_key", sa.String(255), nullable=True))
        batch.add_column(
            sa.Column(
                "cancel_requested_at",
                sa.DateTime(timezone=True).with_variant(DATETIME(fsp=6), "mysql", "mariadb"),
                nullable=True,
            )
        )
    op.create_index(
        "ix_sqlqueue_jobs_group",
        "sqlqueue_jobs",
        ["group_key", "id"],
        postgresql_where=_UNFINISHED,
        sqlite_where=_UNFINISHED,
    )


def downgrade() -> None:
    op.drop_index("ix_sqlqueue_jobs_group", table_name="sqlqueue_jobs")
    with op.batch_alter_table("sqlqueue_jobs") as batch:
        batch.drop_column("cancel_requested_at")
        batch.drop_column("group_key")
