"""The email kind's ledger of sent messages, written with each email job's success.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.mysql import DATETIME

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_TIME = sa.DateTime(timezone=True).with_variant(DATETIME(fsp=6), "mysql", "mariadb")
_JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

#: MariaDB/MySQL: full Unicode, text keys compared byte for byte (as in sqlqueue/_schema.py).
_MYSQL_TABLE: dict[str, Any] = {"mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}


def upgrade() -> None:
    op.create_table(
        "sqlqueue_email_sent",
        sa.Column("key", sa.String(255), primary_key=True),
        sa.Column("message_id", sa.String(255), nullable=False),
        sa.Column("job_id", _ID, nullable=False),
        sa.Column("sent_at", _TIME, nullable=False),
        sa.Column("reply", sa.Text(), nullable=False),
        sa.Column("accepted", _JSON, nullable=False),
        sa.Column("refused", _JSON, nullable=False),
        sa.PrimaryKeyConstraint("key", name="pk_sqlqueue_email_sent"),
        **_MYSQL_TABLE,
    )


def downgrade() -> None:
    op.drop_table("sqlqueue_email_sent")
