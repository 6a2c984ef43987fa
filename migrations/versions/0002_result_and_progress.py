"""Add result and progress to sqlqueue_jobs: a handler's return value and its live progress.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

_JSON = sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("sqlqueue_jobs") as batch:
        batch.add_column(sa.Column("result", _JSON, nullable=True))
        batch.add_column(sa.Column("progress", _JSON, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sqlqueue_jobs") as batch:
        batch.drop_column("progress")
        batch.drop_column("result")
