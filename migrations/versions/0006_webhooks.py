"""Webhook endpoints: the receivers of the webhook kind, their URLs, secrets and state.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.mysql import DATETIME
from sqlalchemy.dialects.postgresql import JSONB

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

_JSON = sa.JSON().with_variant(JSONB(), "postgresql")
_TIME = sa.DateTime(timezone=True).with_variant(DATETIME(fsp=6), "mysql", "mariadb")

#: MariaDB/MySQL: full Unicode, text keys compared byte for byte (as in sqlqueue/_schema.py).
_MYSQL_TABLE: dict[str, Any] = {"mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}


def upgrade() -> None:
    op.create_table(
        "sqlqueue_webhook_endpoints",
        sa.Column("name", sa.String(200), primary_key=True),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("secrets", _JSON, nullable=False),
        sa.Column("retry_statuses", _JSON, nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("disabled_reason", sa.Text(), nullable=True),
        sa.Column("created_at", _TIME, nullable=False),
        sa.Column("updated_at", _TIME, nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_sqlqueue_webhook_endpoints"),
        **_MYSQL_TABLE,
    )


def downgrade() -> None:
    op.drop_table("sqlqueue_webhook_endpoints")
