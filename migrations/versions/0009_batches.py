"""Batches: a group of jobs whose callback job is enqueued once, when the last of them ends.

Revision ID: 0009
Revises: 0007
Create Date: 2026-12-01
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.mysql import DATETIME

revision = "0009"
down_revision = "0007"
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_TIME = sa.DateTime(timezone=True).with_variant(DATETIME(fsp=6), "mysql", "mariadb")
_JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
_IN_BATCH = sa.text("batch_id IS NOT NULL")

#: MariaDB/MySQL: full Unicode, text keys compared byte for byte (as in sqlqueue/_schema.py).
_MYSQL_TABLE: dict[str, Any] = {"mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}


def upgrade() -> None:
    # The batch a job belongs to (a child), or completes (its callback job).
    with op.batch_alter_table("sqlqueue_jobs") as batch:
        batch.add_column(sa.Column("batch_id", _ID, nullable=True))
    # A batch's children by status: its live counts (waiting, running) while it runs.
    op.create_index(
        "ix_sqlqueue_jobs_batch",
        "sqlqueue_jobs",
        ["batch_id", "status"],
        postgresql_where=_IN_BATCH,
        sqlite_where=_IN_BATCH,
    )
    op.create_table(
        "sqlqueue_batches",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("total", sa.Integer(), nullable=False),
        sa.Column("succeeded", sa.Integer(), nullable=False),
        sa.Column("dead", sa.Integer(), nullable=False),
        sa.Column("cancelled", sa.Integer(), nullable=False),
        sa.Column("on_complete", _JSON, nullable=True),
        sa.Column("on_dead", _JSON, nullable=True),
        sa.Column("callback_job_id", _ID, nullable=True),
        sa.Column("created_at", _TIME, nullable=False),
        sa.Column("finished_at", _TIME, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_sqlqueue_batches"),
        **_MYSQL_TABLE,
    )


def downgrade() -> None:
    op.drop_table("sqlqueue_batches")
    op.drop_index("ix_sqlqueue_jobs_batch", table_name="sqlqueue_jobs")
    with op.batch_alter_table("sqlqueue_jobs") as batch:
        batch.drop_column("batch_id")
