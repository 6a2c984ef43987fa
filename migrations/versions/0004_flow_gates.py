"""Flow control gates: a token bucket per rate-limit key, the state of each circuit breaker key.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.mysql import DATETIME

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_TIME = sa.DateTime(timezone=True).with_variant(DATETIME(fsp=6), "mysql", "mariadb")

#: MariaDB/MySQL: full Unicode, text keys compared byte for byte (as in sqlqueue/_schema.py).
_MYSQL_TABLE: dict[str, Any] = {"mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}


def upgrade() -> None:
    op.create_table(
        "sqlqueue_rate_limits",
        sa.Column("key", sa.String(255), primary_key=True),
        sa.Column(
            "tokens", sa.Float().with_variant(sa.Double(), "mysql", "mariadb"), nullable=False
        ),
        sa.Column("refilled_at", _TIME, nullable=False),
        sa.PrimaryKeyConstraint("key", name="pk_sqlqueue_rate_limits"),
        **_MYSQL_TABLE,
    )
    op.create_table(
        "sqlqueue_circuit_breakers",
        sa.Column("key", sa.String(255), primary_key=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("streak_started_at", _TIME, nullable=True),
        sa.Column("open_until", _TIME, nullable=True),
        sa.Column("probe_job_id", _ID, nullable=True),
        sa.Column("probe_attempt", sa.Integer(), nullable=True),
        sa.Column("changed_at", _TIME, nullable=False),
        # op.f: the name is final (the metadata's naming convention would prefix it again).
        sa.CheckConstraint(
            "state IN ('closed', 'open', 'half_open')",
            name=op.f("ck_sqlqueue_circuit_breakers_state"),
        ),
        sa.PrimaryKeyConstraint("key", name="pk_sqlqueue_circuit_breakers"),
        **_MYSQL_TABLE,
    )


def downgrade() -> None:
    op.drop_table("sqlqueue_circuit_breakers")
    op.drop_table("sqlqueue_rate_limits")
