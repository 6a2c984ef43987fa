"""Operators' actions on jobs: who cancelled a job, made it due now or rescheduled it, when and
why — one row per job and action (requeue and discard record on the job row itself).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.mysql import DATETIME

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_TIME = sa.DateTime(timezone=True).with_variant(DATETIME(fsp=6), "mysql", "mariadb")
_JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

#: MariaDB/MySQL: full Unicode, text keys compared byte for byte (as in sqlqueue/_schema.py).
_MYSQL_TABLE: dict[str, Any] = {"mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}


def upgrade() -> None:
    op.create_table(
        "sqlqueue_job_actions",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("job_id", _ID, nullable=False),
        sa.Column("action", sa.String(32), nullable=False),
        sa.Column("by", sa.String(255), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("detail", _JSON, nullable=True),
        sa.Column("at", _TIME, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_sqlqueue_job_actions"),
        **_MYSQL_TABLE,
    )
    op.create_index("ix_sqlqueue_job_actions_job", "sqlqueue_job_actions", ["job_id", "id"])


def downgrade() -> None:
    op.drop_index("ix_sqlqueue_job_actions_job", table_name="sqlqueue_job_actions")
    op.drop_table("sqlqueue_job_actions")
