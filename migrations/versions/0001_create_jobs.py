"""Create sqlqueue_jobs: the job row with its claim, lease, idempotency and status indexes.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.mysql import DATETIME
from sqlalchemy.dialects.postgresql import JSONB

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_JSON = sa.JSON().with_variant(JSONB(), "postgresql")
_TIME = sa.DateTime(timezone=True).with_variant(DATETIME(fsp=6), "mysql", "mariadb")
_CLAIMABLE = sa.text("status IN ('queued', 'failed')")
_RUNNING = sa.text("status = 'running'")

#: MariaDB/MySQL: full Unicode, text keys compared byte for byte (as in sqlqueue/_schema.py).
_MYSQL_TABLE: dict[str, Any] = {"mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}


def upgrade() -> None:
    op.create_table(
        "sqlqueue_jobs",
        sa.Column("id", _ID, primary_key=True, autoincrement=True),
        sa.Column("job_type", sa.String(200), nullable=False),
        sa.Column("queue", sa.String(100), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("payload", _JSON, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("next_run_at", _TIME, nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("errors", _JSON, nullable=False),
        sa.Column("started_at", _TIME, nullable=True),
        sa.Column("finished_at", _TIME, nullable=True),
        sa.Column("created_at", _TIME, nullable=False),
        sa.Column("updated_at", _TIME, nullable=False),
        sa.Column("idempotency_key", sa.String(255), nullable=True),
        sa.Column("locked_by", sa.String(255), nullable=True),
        sa.Column("lease_expires_at", _TIME, nullable=True),
        sa.Column("requeued_from", _ID, nullable=True),
        sa.Column("requeued_as", _ID, nullable=True),
        sa.Column("requeued_at", _TIME, nullable=True),
        sa.Column("requeued_by", sa.String(255), nullable=True),
        sa.Column("requeue_reason", sa.Text(), nullable=True),
        # op.f marks these names as final: the target metadata's naming convention
        # (ck_%(table_name)s_%(constraint_name)s) would otherwise prefix them a second time.
        sa.CheckConstraint(
            "status IN ('queued', 'running', 'succeeded', 'failed', 'dead', 'cancelled')",
            name=op.f("ck_sqlqueue_jobs_status"),
        ),
        sa.CheckConstraint("max_attempts >= 1", name=op.f("ck_sqlqueue_jobs_max_attempts")),
        sa.CheckConstraint(
            "attempts >= 0 AND attempts <= max_attempts", name=op.f("ck_sqlqueue_jobs_attempts")
        ),
        sa.PrimaryKeyConstraint("id", name="pk_sqlqueue_jobs"),
        **_MYSQL_TABLE,
    )
    op.create_index(
        "ix_sqlqueue_jobs_claim",
        "sqlqueue_jobs",
        ["queue", "priority", "next_run_at", "id"],
        postgresql_where=_CLAIMABLE,
        sqlite_where=_CLAIMABLE,
    )
    if op.get_bind().dialect.name in ("mysql", "mariadb"):
        # No partial indexes there: the claimable rows by status (see sqlqueue/_schema.py).
        op.create_index(
            "ix_sqlqueue_jobs_claim_by_status",
            "sqlqueue_jobs",
            ["queue", "status", "priority", "next_run_at", "id"],
        )
    op.create_index(
        "ix_sqlqueue_jobs_lease",
        "sqlqueue_jobs",
        ["lease_expires_at"],
        postgresql_where=_RUNNING,
        sqlite_where=_RUNNING,
    )
    op.create_index(
        "uq_sqlqueue_jobs_idempotency_key", "sqlqueue_jobs", ["idempotency_key"], unique=True
    )
    op.create_index("ix_sqlqueue_jobs_status", "sqlqueue_jobs", ["status", "job_type"])


def downgrade() -> None:
    op.drop_table("sqlqueue_jobs")
