"""Workers: one row per live worker process, with the queues it serves and the job types it
knows, so ``health`` can tell due jobs that no live worker has a task for.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.mysql import DATETIME

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

_TIME = sa.DateTime(timezone=True).with_variant(DATETIME(fsp=6), "mysql", "mariadb")
_JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

#: MariaDB/MySQL: full Unicode, text keys compared byte for byte (as in sqlqueue/_schema.py).
_MYSQL_TABLE: dict[str, Any] = {"mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}


def upgrade() -> None:
    op.create_table(
        "sqlqueue_workers",
        sa.Column("id", sa.String(255), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("version", sa.String(50), nullable=False),
        sa.Column("queues", _JSON, nullable=False),
        sa.Column("job_types", _JSON, nullable=True),
        sa.Column("running", sa.Integer(), nullable=False),
        sa.Column("stopping", sa.Boolean(), nullable=False),
        sa.Column("started_at", _TIME, nullable=False),
        sa.Column("last_seen_at", _TIME, nullable=False),
        sa.Column("expires_at", _TIME, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_sqlqueue_workers"),
        **_MYSQL_TABLE,
    )


def downgrade() -> None:
    op.drop_table("sqlqueue_workers")
